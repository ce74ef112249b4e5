"""``hermes-batch export --compressed`` (issue 26): the rows of ``trajectories_compressed.jsonl``, loaded
back with ``datasets`` offline, a card naming the token budget, the tokenizer and the totals, the
messages format, ``--include passed``, and the refusals (no compressed file, ``--include all``).
The compression is real (:mod:`tests.flows.viewer.compressed_run`)."""

from __future__ import annotations

import json

import pytest

from flows.cli import main
from flows.viewer.export import ExportError, export_run
from hermes_core.compression import SUMMARY_PREFIX
from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tests.flows.viewer.compressed_run import TARGET, compress
from tests.flows.viewer.scored_run import build_scored_run
from tests.flows.viewer.test_compressed import compressed_rows, metrics_of, packed_dir, summariser  # noqa: F401
from tests.flows.viewer.test_export import card_front, load, load_json, offline_datasets  # noqa: F401
from tests.hermes_core.test_compression import tokenizer_file  # noqa: F401  (a fixture)


def test_export_compressed_loads_with_datasets_and_holds_the_compressed_rows(packed_dir, tmp_path):  # noqa: F811
    out = tmp_path / "ds"
    result = export_run(packed_dir, out, valid_tools=ALL_POSSIBLE_TOOLS, compressed=True)
    assert result.rows == 4
    exported, reference = load(out), load_json(packed_dir / "trajectories_compressed.jsonl")
    assert exported.to_list() == reference.to_list()
    assert exported.features == reference.features
    summaries = [
        t["value"] for r in exported for t in r["conversations"] if t["value"].startswith(SUMMARY_PREFIX)
    ]
    assert len(summaries) == 2
    front, body = card_front(out)
    assert "compressed" in front["tags"]
    totals = metrics_of(packed_dir)["totals"]
    assert "## Compression to a token budget" in body
    tokenizer = metrics_of(packed_dir)["settings"]["tokenizer"]
    assert tokenizer.endswith("tokenizer.json")
    assert f"at most **{TARGET} tokens** counted with the tokenizer `{tokenizer}`" in body
    assert f"| {totals['compressed']} | {totals['untouched']} | {totals['still_over']} | 0 | 0 |" in body
    assert f"{totals['tokens_before']} tokens before, {totals['tokens_after']} after" in body
    manifest = json.loads((out / ".hermes-export.json").read_text())
    assert manifest["compressed"] is True


def test_export_compressed_as_messages(packed_dir, tmp_path):  # noqa: F811
    out = tmp_path / "msgs"
    export_run(packed_dir, out, valid_tools=ALL_POSSIBLE_TOOLS, fmt="messages", compressed=True)
    rows = load(out).to_list()
    row = next(r for r in rows if r["prompt_index"] == 1)
    users = [m["content"] for m in row["messages"] if m["role"] == "user"]
    assert len(users) == 2 and users[1].startswith(SUMMARY_PREFIX)


def test_export_compressed_include_passed_and_the_refusals(tmp_path, tokenizer_file, summariser, capsys):  # noqa: F811
    (tmp_path / "s").mkdir()
    scored = build_scored_run(tmp_path / "s")
    argv = ["export", str(scored), "--out", str(tmp_path / "none"), "--compressed"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: {scored / 'trajectories_compressed.jsonl'}: not found: run hermes-batch compress"
    )
    assert err.count("\n") == 1 and not (tmp_path / "none").exists()

    compress(scored, tokenizer_file, summariser.base_url, target=5000)
    out = tmp_path / "passed"
    assert main(["export", str(scored), "--out", str(out), "--compressed", "--include", "passed"]) == 0
    assert "(sharegpt, passed, compressed)" in capsys.readouterr().out
    passing = [r for r in compressed_rows(scored) if r["metadata"].get("passed") is True]
    assert len(passing) == 4 and [r["metadata"]["prompt_id"] for r in load(out)] == [
        r["metadata"]["prompt_id"] for r in passing
    ]
    with pytest.raises(ExportError, match="--include all cannot be combined with --compressed"):
        export_run(scored, tmp_path / "all", valid_tools=ALL_POSSIBLE_TOOLS, include="all", compressed=True)
    assert not (tmp_path / "all").exists()
