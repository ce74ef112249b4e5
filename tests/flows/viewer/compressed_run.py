"""A run folder with ``trajectories_compressed.jsonl``, made for real: the run by the product's own
code (:func:`tests.run_folders.build_run`), then :func:`hermes_core.compression.compress_jsonl`
with the word-level ``tokenizer.json`` and the mock summariser over HTTP of
``tests/hermes_core/test_compression.py`` (its helpers are imported, not copied).

Prompts (:data:`COMPRESSED_PLAN`) and what compression does to them at :data:`TARGET` tokens::

    0 kept       short                                      -> untouched
    1 long       8 tool rounds of ~100 words each           -> compressed
    2 big_head   its first tool response alone is too long  -> still_over (nothing it may replace)
    3 discarded  no reasoning: no row                       -> (not in the file)
    4 long       as 1                                       -> compressed
    5 pending    not run                                    -> (not in the file)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

from hermes_core.compression import ModelSummariser, compress_jsonl, load_tokenizer
from hermes_core.runfolder.folder import RunFolder
from tests import run_folders
from tests.hermes_core.test_compression import settings, words

TARGET = 600
"""The token budget (words of the word-level tokenizer)."""

ROUNDS = 8
"""Tool rounds of a ``long`` conversation."""

COMPRESSED_PLAN = [
    ("kept", "List the files in the working directory"),
    ("long", "Survey the repository one file at a time"),
    ("big_head", "Dump the whole log at once"),
    ("discarded", "Answer without any thinking"),
    ("long", "Read every chapter of the manual"),
    ("pending", "Never run yet"),
]

_conversation = run_folders.conversation


def _call(n: int, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"id": f"call_{n}", "type": "function", "function": {"name": "terminal", "arguments": arguments}}


def _result(n: int, output: str) -> dict[str, Any]:
    content = json.dumps({"output": output, "exit_code": 0, "error": None})
    return {"role": "tool", "tool_call_id": f"call_{n}", "name": "terminal", "content": content}


def conversation(kind: str, prompt: str) -> list[dict[str, Any]]:
    """:func:`tests.run_folders.conversation`, plus the kinds ``long`` and ``big_head``."""
    if kind not in ("long", "big_head"):
        return _conversation(kind, prompt)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    rounds = ROUNDS if kind == "long" else 1
    for n in range(rounds):
        size = 100 if kind == "long" else TARGET + 50
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {n}.",
                "reasoning": f"Look at part {n}.",
                "tool_calls": [_call(n, f"cat part{n}.txt")],
            }
        )
        messages.append(_result(n, f"part {n}: " + words(size, "gamma")))
    messages.append({"role": "assistant", "content": "Done: all parts read.", "reasoning": "Enough."})
    return messages


def build_compressed_run(root: Path, tokenizer: Path, base_url: str, *, run_name: str = "packed") -> Path:
    """Write the run ``root/data/<run_name>`` of :data:`COMPRESSED_PLAN` and compress its
    ``trajectories.jsonl`` to :data:`TARGET` tokens (the mock summariser at ``base_url`` answers
    50 words), as ``hermes-batch compress`` does; returns the run folder."""
    with mock.patch.object(run_folders, "conversation", conversation):
        run_dir = run_folders.build_run(root, COMPRESSED_PLAN, run_name=run_name)
    compress(run_dir, tokenizer, base_url)
    return run_dir


def compress(run_dir: Path, tokenizer: Path, base_url: str, target: int = TARGET) -> dict[str, Any]:
    """Compress the run's ``trajectories.jsonl`` into its compressed file, metrics and cache."""
    folder = RunFolder(run_dir)
    return compress_jsonl(
        folder.trajectories,
        out=folder.compressed,
        cache_path=folder.compression_cache,
        metrics_path=folder.compression_metrics,
        counter=load_tokenizer(str(tokenizer)),
        settings=settings(target),
        summarise=ModelSummariser("mock/summariser", base_url),
        workers=2,
    )
