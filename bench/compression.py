"""Time and peak memory to compress rows of about 30k tokens each to the 15,250-token budget (issue 26).

The rows are synthetic ShareGPT rows (a system turn, a prompt, then gpt ``<tool_call>`` / tool
``<tool_response>`` pairs of about 900 tokens, up to ``--tokens``), written to a JSONL file
first. The tokenizer is a byte-level BPE (vocabulary 8,000) trained here on the same kind of
text (or ``--tokenizer tokenizer.json``). The summariser is the mock (``mock/summariser``, 50
words, 0 ms) in its own process over HTTP. The compression runs in a child process
(:func:`hermes_core.compression.compress_jsonl`, ``--workers`` rows at once) so that its peak RSS
(``ru_maxrss``) is its own: once from an empty cache, then once more with every row cached (a
killed run's restart: no request).

Usage:
    python bench/compression.py [--rows 10000] [--tokens 30000] [--workers 8] [--tokenizer FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, WORK, MockModel, emit, log, peak_rss_mb  # noqa: E402

TURN_WORDS = 420
"""Words of a generated gpt or tool turn (about 450 BPE tokens with the trained tokenizer)."""


def _vocabulary(rng: random.Random, n: int = 3000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def _text(rng: random.Random, vocab: list[str], words: int) -> str:
    return " ".join(rng.choices(vocab, k=words))


def build_tokenizer(path: Path, rng: random.Random, vocab: list[str]) -> None:
    """Train a byte-level BPE on synthetic text of the rows' kind and save it to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        _text(rng, vocab, 200) + ' {"name": "terminal", "arguments": {"command": "ls -la"}}'
        for _ in range(2000)
    ]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>"]))
    tok.save(str(path))


def write_rows(path: Path, rows: int, tokens: int, tokenizer: Path, seed: int) -> dict:
    """Write ``rows`` rows of about ``tokens`` tokens to ``path`` from a pool of turns; returns the mean size."""
    from tokenizers import Tokenizer

    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    tok = Tokenizer.from_file(str(tokenizer))
    calls = [
        f'<tool_call>\n{{"name": "terminal", "arguments": {{"command": "grep {w} -r ."}}}}\n</tool_call>\n'
        + _text(rng, vocab, TURN_WORDS)
        for w in vocab[:200]
    ]
    results = [
        f'<tool_response>\n{{"output": "{_text(rng, vocab, TURN_WORDS)}", "exit_code": 0}}\n</tool_response>'
        for _ in range(200)
    ]
    system = "You are a function calling AI model. <tools>" + _text(rng, vocab, 700) + "</tools>"
    per_pair = len(tok.encode(calls[0]).ids) + len(tok.encode(results[0]).ids)
    pairs = max(1, (tokens - len(tok.encode(system).ids)) // per_pair)
    size = 0
    with open(path, "w", encoding="utf-8") as out:
        for i in range(rows):
            turns = [
                {"from": "system", "value": system},
                {"from": "human", "value": f"Task {i}: " + vocab[i % 3000]},
            ]
            for k in range(pairs):
                turns.append({"from": "gpt", "value": calls[(i + k) % 200]})
                turns.append({"from": "tool", "value": results[(i * 7 + k) % 200]})
            turns.append({"from": "gpt", "value": f"Done with task {i}."})
            line = json.dumps({"prompt_index": i, "conversations": turns, "metadata": {"prompt_id": f"p{i}"}})
            size += out.write(line + "\n")
    return {"pairs_per_row": pairs, "input_mb": round(size / 2**20, 1)}


def child(folder: Path, base_url: str, workers: int, target: int) -> None:
    """Compress ``folder/in.jsonl`` twice (empty cache, then all cached); print the figures."""
    from hermes_core.compression import CompressionSettings, ModelSummariser, compress_jsonl, load_tokenizer

    counter = load_tokenizer(str(folder / "tokenizer.json"))
    settings = CompressionSettings(
        target_max_tokens=target, summary_target_tokens=750, summary_model="mock/summariser"
    )
    summarise = ModelSummariser("mock/summariser", base_url)
    result = {}
    for label in ("first", "cached"):
        started, cpu = time.monotonic(), time.process_time()
        metrics = compress_jsonl(
            folder / "in.jsonl",
            out=folder / "out.jsonl",
            cache_path=folder / "compression.jsonl",
            metrics_path=folder / "metrics.json",
            counter=counter,
            settings=settings,
            summarise=summarise,
            workers=workers,
        )
        totals = metrics["totals"]
        result[label] = {
            "seconds": round(time.monotonic() - started, 2),
            "cpu_seconds": round(time.process_time() - cpu, 2),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "summariser_requests": totals["summariser_calls_this_run"],
            **{
                k: totals[k]
                for k in ("rows", "compressed", "still_over", "failed", "tokens_before", "tokens_after")
            },
            "mean_tokens_before": totals["averages"]["tokens_before_per_row"],
        }
    emit(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--tokens", type=int, default=30000, help="tokens per row (about)")
    parser.add_argument("--target", type=int, default=15250)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--tokenizer", help="a tokenizer.json (default: a BPE trained here)")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "BASE_URL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), args.child[1], args.workers, args.target)
        return
    WORK.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="compression-", dir=WORK))
    try:
        tokenizer = folder / "tokenizer.json"
        if args.tokenizer:
            shutil.copy(args.tokenizer, tokenizer)
        else:
            rng = random.Random(args.seed)
            build_tokenizer(tokenizer, rng, _vocabulary(rng))
        log(f"writing {args.rows} rows of about {args.tokens} tokens")
        started = time.monotonic()
        shape = write_rows(folder / "in.jsonl", args.rows, args.tokens, tokenizer, args.seed)
        log(f"written in {time.monotonic() - started:.1f} s: {shape}")
        with MockModel(folder / "mock.log") as mock:
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(folder), mock.base_url, f"--workers={args.workers}",
                 f"--target={args.target}"],
                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
            )  # fmt: skip
            requests = mock.requests()
        if done.returncode != 0:
            raise SystemExit(f"the compression failed:\n{done.stderr}")
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("BENCH_RESULT "))
        result = json.loads(line.removeprefix("BENCH_RESULT "))
        first, cached = result["first"], result["cached"]
        print(
            f"rows: {args.rows} x about {args.tokens} tokens ({shape['input_mb']} MB of JSONL); workers {args.workers}"
        )
        print(
            f"first run: {first['seconds']} s ({args.rows / first['seconds']:.0f} rows/s, "
            f"{first['tokens_before'] / first['seconds'] / 1e6:.1f} M tokens/s), CPU {first['cpu_seconds']} s, "
            f"peak RSS {first['peak_rss_mb']} MB; {first['compressed']} compressed, {first['still_over']} still over, "
            f"{first['failed']} failed; mean {first['mean_tokens_before']} tokens before"
        )
        print(
            f"again, every row cached: {cached['seconds']} s, {cached['summariser_requests']} summariser requests; "
            f"peak RSS over both runs {cached['peak_rss_mb']} MB; the mock served {requests} requests in all"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
