"""A run compressed to a token budget in the viewer (issue 26): the trajectory page shows the original
and compressed rows side by side with the summary turn marked and the row's figures, the run page
the totals, and the index follows a new compression. The compression is real
(:mod:`tests.flows.viewer.compressed_run`)."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from flows.viewer import index as run_index
from flows.viewer.app import create_app
from flows.viewer.index import RunIndex
from hermes_core.compression import SUMMARY_NOTICE, SUMMARY_PREFIX
from hermes_core.mockllm import MockServer
from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tests.flows.viewer.compressed_run import TARGET, build_compressed_run, compress
from tests.flows.viewer.scored_run import build_scored_run
from tests.hermes_core.test_compression import tokenizer_file  # noqa: F401  (a fixture)
from tests.live_app import serve


@pytest.fixture(scope="module")
def summariser():
    with MockServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory, tokenizer_file, summariser) -> Path:  # noqa: F811
    return build_compressed_run(tmp_path_factory.mktemp("compressed"), tokenizer_file, summariser.base_url)


@pytest.fixture(scope="module")
def base(packed_dir):
    with serve(create_app(packed_dir)) as url:
        yield url


def metrics_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "compression_metrics.json").read_text(encoding="utf-8"))


def compressed_rows(run_dir: Path) -> list[dict]:
    text = (run_dir / "trajectories_compressed.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def row_metrics(run_dir: Path, prompt_index: int) -> dict:
    return next(r for r in metrics_of(run_dir)["rows"] if r["prompt_index"] == prompt_index)


def section(page: str, css_class: str) -> str:
    """The text of the first ``<section class="css_class ...">`` of a page."""
    match = re.search(rf'<section class="{css_class}[^"]*"[^>]*>(.*?)</section>', page, re.S)
    assert match, css_class
    return match.group(1)


def articles(page: str, prefix: str) -> list[tuple[int, str]]:
    """(turn number, class) of every turn article whose id starts with ``prefix``."""
    found = re.findall(rf'<article class="([^"]+)" id="{prefix}(\d+)">', page)
    return [(int(n), cls) for cls, n in found]


def test_the_compressed_file_is_what_the_plan_says(packed_dir):
    statuses = {r["prompt_index"]: r["status"] for r in metrics_of(packed_dir)["rows"]}
    assert statuses == {0: "untouched", 1: "compressed", 2: "still_over", 4: "compressed"}
    rows = compressed_rows(packed_dir)
    originals = [json.loads(line) for line in (packed_dir / "trajectories.jsonl").read_text().splitlines()]
    # the compressed rows keep metadata.prompt_id: the viewer matches them to their originals by it
    assert [r["metadata"]["prompt_id"] for r in rows] == [r["metadata"]["prompt_id"] for r in originals]


def test_the_trajectory_page_shows_both_versions_and_the_marked_summary_turn(base, packed_dir):
    page = httpx.get(base + "/prompt/1", timeout=10)
    assert page.status_code == 200
    text = page.text
    m = row_metrics(packed_dir, 1)
    region = m["region"]
    assert (region["first"], region["last"]) == (4, 13)
    figures = html.unescape(section(text, "compression"))
    assert "Compression to 600 tokens" in figures and "compressed</span>" in figures
    saved = m["tokens_before"] - m["tokens_after"]
    assert f"{m['tokens_before']} → {m['tokens_after']} ({saved} saved, ratio " in figures
    assert f"{m['turns_before']} → {m['turns_after']}" in figures
    assert "turns 4-13 summarised" in figures

    compare = section(text, "turns compare")
    # the original: all 19 turns, 4-13 inside the box of the replaced region
    assert [n for n, _ in articles(compare, "turn-")] == list(range(19))
    replaced = re.search(
        r'<div class="replaced">(.*?)</div>\s*</div>\s*<div class="side compressed">', compare, re.S
    )
    assert replaced and [n for n, _ in articles(replaced.group(1), "turn-")] == list(range(4, 14))
    # the compressed: 10 turns, turn 4 the summary, marked
    packed = next(r for r in compressed_rows(packed_dir) if r["prompt_index"] == 1)
    assert [n for n, _ in articles(compare, "compressed-turn-")] == list(range(10))
    summary_turns = [n for n, cls in articles(compare, "compressed-turn-") if "turn-summary" in cls]
    assert summary_turns == [4]
    turn = re.search(
        r'<article class="turn turn-human turn-summary" id="compressed-turn-4">(.*?)</article>', compare, re.S
    )
    body = turn.group(1)
    assert '<span class="summary-label">context summary</span>' in body
    assert '<span class="summary-region">turns 4-13 summarised</span>' in body
    value = packed["conversations"][4]["value"]
    assert value.startswith(SUMMARY_PREFIX) and html.escape(value, quote=False) in body
    # it sits beside the region it replaced, and the system turn is marked for its notice
    assert packed["conversations"][0]["value"].endswith(SUMMARY_NOTICE)
    system = re.search(r'id="compressed-turn-0">\s*<header>(.*?)</header>', compare, re.S).group(1)
    assert "summary notice added" in system
    pair = re.search(r'<div class="pair pair-summary">(.*?)<div class="pair', compare, re.S).group(1)
    assert 'id="turn-4"' in pair and 'id="turn-13"' in pair and 'id="compressed-turn-4"' in pair


def test_rows_compression_left_as_they_were_show_their_figures_only(base, packed_dir):
    untouched = httpx.get(base + "/prompt/0", timeout=10).text
    assert "untouched (at or under the budget)" in section(untouched, "compression")
    assert "yes, as is" in section(untouched, "compression")
    assert 'class="turns compare"' not in untouched and 'id="compressed-turn-' not in untouched
    assert [n for n, _ in articles(untouched, "turn-")] == list(range(5))

    over = httpx.get(base + "/prompt/2", timeout=10).text
    m = row_metrics(packed_dir, 2)
    figures = html.unescape(section(over, "compression"))
    assert "still over the budget" in figures and f"{m['tokens_before']} → {m['tokens_before']}" in figures
    assert m["tokens_before"] > TARGET and 'class="turns compare"' not in over
    for no_row in (3, 5):  # discarded, not run: nothing was compressed
        page = httpx.get(base + f"/prompt/{no_row}", timeout=10).text
        assert 'class="compression"' not in page


def test_the_run_page_shows_the_compression_totals(base, packed_dir):
    page = httpx.get(base + "/", timeout=10).text
    totals = metrics_of(packed_dir)["totals"]
    box = html.unescape(section(page, "compression"))
    assert "Compressed to 600 tokens" in box and "tokenizer.json" in box
    for status, label in [
        ("compressed", "compressed"),
        ("untouched", "untouched"),
        ("still_over", "still over"),
        ("failed", "failed"),
        ("dropped", "dropped"),
    ]:
        assert f'id="comp-{status}"><span class="n">{totals[status]}</span> {label}</div>' in box
    assert (totals["compressed"], totals["untouched"], totals["still_over"]) == (2, 1, 1)
    assert (
        f"{totals['tokens_before']} before · {totals['tokens_after']} after · "
        f"{totals['tokens_saved']} saved · ratio {totals['overall_ratio']}"
    ) in box
    assert "1 written over the budget" in box


def test_a_run_without_compression_shows_none(tmp_path):
    run_dir = build_scored_run(tmp_path)
    with serve(create_app(run_dir)) as url:
        assert 'class="compression"' not in httpx.get(url + "/", timeout=10).text
        assert 'class="compression"' not in httpx.get(url + "/prompt/0", timeout=10).text


def test_the_index_follows_a_new_compression(tmp_path, tokenizer_file, summariser, monkeypatch):  # noqa: F811
    run_dir = build_compressed_run(tmp_path, tokenizer_file, summariser.base_url)
    index = RunIndex.open(run_dir, valid_tools=ALL_POSSIBLE_TOOLS)
    assert index.entry(1)["comp_status"] == "compressed" and index.compression["totals"]["compressed"] == 2
    cached = RunIndex.open(run_dir, valid_tools=ALL_POSSIBLE_TOOLS)
    assert cached.build_seconds == 0.0 and cached.compression == index.compression  # from .view-index.*
    monkeypatch.setattr(run_index, "REFRESH_SECONDS", 0.0)
    time.sleep(0.01)
    compress(run_dir, tokenizer_file, summariser.base_url, target=5000)  # every row fits now
    assert index.refresh()
    assert index.entry(1)["comp_status"] == "untouched" and index.compression["totals"]["untouched"] == 4
    assert index.compressed_row(index.entry(1)) == compressed_rows(run_dir)[1]
