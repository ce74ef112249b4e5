"""CPU cost of scoring one sample (issue 25): the ``answer`` scorer, and a ``verify`` command in the prompt's sandbox.

``answer``: :func:`hermes_core.scoring.score_answer` on a final turn with reasoning and an
``ANSWER:`` line, ``--n`` times; CPU microseconds per sample (``time.process_time``).
``verify``: :func:`hermes_core.scoring.score_verify` running ``test -d .`` ``--m`` times in one
sandbox of the local backend (bubblewrap when installed, as a run uses); CPU milliseconds of this
process per sample (the command's own CPU, inside the sandbox's pid namespace, is not in this
process's accounting; ``bench/sandbox_overhead.py`` measures a command's machine CPU: about the same
as a plain command's).
``judge``: :func:`hermes_core.scoring.score_judge` through a :class:`~hermes_core.client.ModelClient`
against the mock judge (``mock/judge``) served by another process, ``--j`` times; CPU milliseconds
of this process per sample (the request, its JSON, the verdict; the judge's own time is the
provider's).

Usage:
    python bench/scoring.py [--n 20000] [--m 200] [--j 300]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from hermes_core.client import ModelClient, ModelOptions
from hermes_core.environments.local import LocalEnvironment
from hermes_core.scoring import score_answer, score_judge, score_verify

FINAL = "<think>\nLet me compute.\n</think>\nThe product of six and seven is forty-two.\nANSWER: 42"


def main() -> None:
    """Print the two figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="answer scorings")
    parser.add_argument("--m", type=int, default=200, help="verify commands")
    parser.add_argument("--j", type=int, default=300, help="judge requests")
    args = parser.parse_args()
    started = time.process_time()
    for _ in range(args.n):
        score_answer(FINAL, ["42", "forty-two"])
    print(f"answer scorer: {1e6 * (time.process_time() - started) / args.n:.1f} us CPU per sample")
    with LocalEnvironment() as env:
        env.execute("true")  # the sandbox starts on first use: not part of the figure
        started = time.process_time()
        for _ in range(args.m):
            score_verify(env, "test -d .", 30)
        per_sample = 1000 * (time.process_time() - started) / args.m
        print(
            f"verify scorer (test -d . in the prompt's sandbox): {per_sample:.2f} ms CPU of this process per sample"
        )
    server = subprocess.Popen(
        [sys.executable, "-m", "hermes_core.mockllm", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        base_url = server.stdout.readline().strip()
        client = ModelClient(
            ModelOptions(model="mock/judge", temperature=0.0), base_url=base_url, api_key=None
        )
        score_judge(client, "warm-up", "42", "42")  # the first request opens the connection
        started = time.process_time()
        for i in range(args.j):
            score_judge(client, f"What is six times seven? ({i})", FINAL, ["42", "forty-two"])
        per_sample = 1000 * (time.process_time() - started) / args.j
        print(
            f"judge scorer (one request to the mock judge): {per_sample:.2f} ms CPU of this process per sample"
        )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
