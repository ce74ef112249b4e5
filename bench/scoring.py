"""CPU cost of scoring one sample (issue 25): the ``answer`` scorer, and a ``verify`` command in the prompt's sandbox.

``answer``: :func:`hermes_core.scoring.score_answer` on a final turn with reasoning and an
``ANSWER:`` line, ``--n`` times; CPU microseconds per sample (``time.process_time``).
``verify``: :func:`hermes_core.scoring.score_verify` running ``test -d .`` ``--m`` times in one
sandbox of the local backend (bubblewrap when installed, as a run uses); CPU milliseconds of this
process per sample (the command's own CPU, inside the sandbox's pid namespace, is not in this
process's accounting; ``bench/sandbox_overhead.py`` measures a command's machine CPU: about the same
as a plain command's).

Usage:
    python bench/scoring.py [--n 20000] [--m 200]
"""

from __future__ import annotations

import argparse
import time

from hermes_core.environments.local import LocalEnvironment
from hermes_core.scoring import score_answer, score_verify

FINAL = "<think>\nLet me compute.\n</think>\nThe product of six and seven is forty-two.\nANSWER: 42"


def main() -> None:
    """Print the two figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="answer scorings")
    parser.add_argument("--m", type=int, default=200, help="verify commands")
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


if __name__ == "__main__":
    main()
