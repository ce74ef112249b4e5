"""The viewer over real HTTP (uvicorn on a free port): run page, filters, trajectory pages, escaping,
security headers, the Host check, out-of-range integers, the index cache, the ``hermes-batch
view`` command line, and scores (score column and filter, pass@k, verify output, samples,
re-scores from ``scores.jsonl``, rows the ``--keep`` filter rejected)."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.cli import main
from flows.viewer import index as run_index
from flows.viewer.app import CONTENT_SECURITY_POLICY, MAX_PAGE, create_app, viewer_hosts
from flows.viewer.index import RunIndex
from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tests.conftest import free_port
from tests.flows.viewer.scored_run import build_scored_run, prompt_ids, rescore
from tests.live_app import serve
from tests.run_folders import DEFAULT_PLAN, TEST_FLOW_RUN_ID, build_run

REPO = Path(__file__).resolve().parents[3]
ROW_RE = re.compile(
    r'<tr class="status-(\w+)">\s*<td class="idx">(\d+)</td>\s*<td class="prompt"><a href="/prompt/(\d+)[^"]*">([^<]*)</a>'
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("viewer"))


@pytest.fixture(scope="module")
def base(run_dir):
    with serve(create_app(run_dir)) as url:
        yield url


def listed(page: str) -> list[tuple[int, str, str]]:
    """(prompt_index, status, prompt head) of every row of a run page."""
    return [(int(idx), status, html.unescape(head)) for status, idx, link, head in ROW_RE.findall(page)]


def get(base: str, path: str, **params) -> httpx.Response:
    return httpx.get(base + path, params=params, timeout=10)


def test_run_page_lists_every_prompt_with_its_status(base):
    page = get(base, "/")
    assert page.status_code == 200
    expected_status = {
        "kept": "kept",
        "xss": "kept",
        "discarded": "discarded",
        "filtered": "filtered",
        "failed": "failed",
        "turn_limit": "kept",
        "partial": "kept",
        "tool_error": "kept",
        "pending": "pending",
    }
    assert listed(page.text) == [(i, expected_status[k], p) for i, (k, p) in enumerate(DEFAULT_PLAN)]
    text = page.text
    assert "9 prompts match" in text
    for label, n in [
        ("kept", 5),
        ("discarded (no reasoning)", 1),
        ("filtered (hallucinated tool)", 1),
        ("failed", 1),
        ("not run yet", 1),
    ]:
        assert f'<span class="n">{n}</span> {label}</a>' in text
    # the summary: reasoning coverage, tool usage, tokens, settings (statistics.json / run.json)
    # 5 kept rows: 2+2+1 (turn limit)+2+2 assistant turns, all with reasoning; the tombstone's 2 turns without
    assert "9/11 assistant turns (81.82%)" in text
    assert "<td>mock/scripted</td>" in text and "<td>terminal_only</td>" in text
    assert re.search(r'<a href="/\?tool=terminal">terminal</a></td><td>5</td><td>4</td><td>1</td>', text)


@pytest.mark.parametrize(
    ("params", "indices"),
    [
        ({"status": "failed"}, [4]),
        ({"status": "pending"}, [8]),
        ({"status": "kept"}, [0, 1, 5, 6, 7]),
        ({"partial": "1"}, [6]),
        ({"turn_limit": "1"}, [5]),
        ({"tool": "hallucinated_tool"}, [3]),
        ({"tool_errors": "1"}, [7]),
        ({"q": "TRICKY markup"}, [1]),
        ({"q": "THE", "status": "kept"}, [0, 1, 5, 6]),
        ({"q": "no such text"}, []),
        ({"per_page": "4", "page": "3"}, [8]),
    ],
)
def test_filters_and_pages(base, params, indices):
    page = get(base, "/", **params)
    assert page.status_code == 200
    assert [i for i, _, _ in listed(page.text)] == indices


def test_bad_query_is_a_400(base):
    answer = get(base, "/", status="bogus")
    assert answer.status_code == 400 and "unknown status 'bogus'" in answer.text
    assert get(base, "/", page="0").status_code == 422
    assert get(base, "/prompt/99").status_code == 404


def test_out_of_range_integers_are_a_422_never_a_500(base):
    huge = "99999999999999999999999"
    for params in ({"page": huge}, {"page": str(2**62)}, {"page": str(MAX_PAGE + 1)}, {"per_page": huge}):
        answer = get(base, "/", **params)
        assert answer.status_code == 422, (params, answer.status_code)
    last = get(base, "/", page=str(MAX_PAGE), per_page="4")  # past the end: the last page
    assert last.status_code == 200 and "page 3 of 3" in last.text
    assert [i for i, _, _ in listed(last.text)] == [8]
    for path in (f"/prompt/{huge}", f"/prompt/-{huge}", f"/prompt/{2**63}"):
        assert get(base, path).status_code == 404
    assert get(base, "/prompt/1", page=huge).status_code == 200  # not a parameter of that page


def test_only_the_bound_host_names_are_answered(base):
    port = base.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}", "localhost"):
        answer = httpx.get(base + "/", headers={"Host": host}, timeout=10)
        assert answer.status_code == 200, host
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", "[::2]", "a b"):
        for path in ("/", "/prompt/1", "/static/viewer.css"):
            answer = httpx.get(base + path, headers={"Host": host}, timeout=10)
            assert answer.status_code == 400 and answer.text == "Invalid host header", (host, path)
            assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


def test_viewer_hosts_follow_the_bound_address():
    assert viewer_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "[::1]"]
    assert viewer_hosts("::1") == ["127.0.0.1", "localhost", "[::1]"]
    assert viewer_hosts("192.168.1.7", ["Viewer.LAN"]) == [
        "127.0.0.1", "localhost", "[::1]", "192.168.1.7", "viewer.lan"
    ]  # fmt: skip
    assert viewer_hosts("fe80::1") == ["127.0.0.1", "localhost", "[::1]", "[fe80::1]"]
    import socket

    every = viewer_hosts("0.0.0.0")
    assert "0.0.0.0" not in every and socket.gethostname().lower() in every


def test_every_response_has_the_security_headers(base):
    for path in ("/", "/prompt/1", "/static/viewer.css", "/prompt/99"):
        answer = get(base, path)
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert "script-src" not in CONTENT_SECURITY_POLICY and "default-src 'none'" in CONTENT_SECURITY_POLICY
    assert get(base, "/static/viewer.css").headers["content-type"].startswith("text/css")


def test_trajectory_page_escapes_tool_output_and_shows_metadata(base):
    page = get(base, "/prompt/1").text
    assert "<script" not in page and "<img" not in page and 'onerror="' not in page
    # the tool output, pretty-printed JSON, as escaped text
    assert (
        "&#34;output&#34;: &#34;&lt;script&gt;window.pwned=1&lt;/script&gt;"
        "&lt;img src=x onerror=\\&#34;window.pwned=2\\&#34;&gt;&#34;"
    ) in page
    assert '<details class="think"><summary>think (' in page
    assert "<pre>I should run echo" in page
    assert '<details class="system"><summary>system prompt · 1 tools: terminal</summary>' in page
    assert '<details class="call" open><summary>tool call · terminal</summary>' in page
    assert "&#34;exit_code&#34;: 0" in page  # tool response pretty-printed
    for label, value in [
        ("stop reason", "final_answer"),
        ("attempt", "1"),
        ("cost", "$0.001000"),
        ("toolsets offered", "terminal"),
    ]:
        assert f"<tr><th>{label}</th><td>{value}</td></tr>" in page
    assert "<tr><th>tokens</th><td>100 prompt, 20 completion, 5 reasoning</td></tr>" in page


def test_failed_discarded_and_pending_pages(base):
    failed = get(base, "/prompt/4").text
    assert '<td class="error-type">ModelError</td>' in failed
    assert "HTTP 500: &lt;b&gt;boom&lt;/b&gt;" in failed and "<b>boom" not in failed
    assert "<td>2</td>" in failed  # attempts
    discarded = get(base, "/prompt/2").text
    assert "Discarded: no reasoning in any assistant turn" in discarded
    assert "&#34;assistant_turns&#34;: 2" in discarded
    pending = get(base, "/prompt/8").text
    assert "This prompt has not run yet." in pending and "Never run yet" in pending


def test_previous_and_next_follow_the_filtered_list(base):
    page = get(base, "/prompt/5", status="kept").text
    assert '<a rel="prev" href="/prompt/1?status=kept">' in page
    assert '<a rel="next" href="/prompt/6?status=kept">' in page
    first = get(base, "/prompt/0").text
    assert 'rel="prev"' not in first and '<a rel="next" href="/prompt/1">' in first


def test_index_is_cached_and_rebuilt_when_a_batch_file_changes(tmp_path, monkeypatch):
    run_dir = build_run(tmp_path, [("kept", "first prompt"), ("pending", "second prompt")])
    index = RunIndex.open(run_dir, valid_tools=ALL_POSSIBLE_TOOLS)
    assert index.build_seconds > 0 and (run_dir / ".view-index.parquet").is_file()
    assert index.counts()["pending"] == 1
    again = RunIndex.open(run_dir, valid_tools=ALL_POSSIBLE_TOOLS)
    assert again.build_seconds == 0.0  # read from the cache
    # a later invocation writes the pending prompt's row: the index notices (size/mtime)
    monkeypatch.setattr(run_index, "REFRESH_SECONDS", 0.0)
    row = json.loads((run_dir / "trajectories.jsonl").read_text().splitlines()[0])
    pending_id = again.table.filter(again.table["status"] == "pending")["prompt_id"][0]
    row["prompt_index"], row["metadata"]["prompt_id"] = 1, pending_id
    with open(run_dir / "batch_7.jsonl", "w", encoding="utf-8") as fh:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    assert again.refresh() is True
    assert again.counts() == {
        "kept": 2, "rejected": 0, "discarded": 0, "filtered": 0, "failed": 0, "pending": 0,
    }  # fmt: skip
    assert again.row(again.entry(1))["metadata"]["prompt_id"] == pending_id


def test_missing_dataset_lists_what_the_run_folder_knows(tmp_path):
    run_dir = build_run(
        tmp_path, [("kept", "known prompt"), ("failed", "failing prompt"), ("pending", "unknown")]
    )
    (tmp_path / "prompts.jsonl").unlink()
    with serve(create_app(run_dir)) as url:
        page = get(url, "/").text
    assert "not found: prompts not run yet are not listed" in page
    assert [(i, s) for i, s, _ in listed(page)] == [(0, "kept"), (1, "failed")]


def test_view_command_errors_are_one_line(tmp_path, capsys):
    assert main(["view", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'nope'}: not a folder"]
    assert main(["view", str(tmp_path), "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == "error: --port 70000: must be between 0 and 65535"
    assert main(["view", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("no run.json (not a hermes-batch run folder)")


@pytest.mark.slow  # starts the command line in a subprocess
def test_view_command_serves_the_run(run_dir, tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "view",
            str(run_dir),
            f"--port={port}",
            "--allow_host=viewer.lan",
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline, "viewer did not start"
                time.sleep(0.2)
        assert answer.status_code == 200 and "9 prompts match" in answer.text
        for host, status in (("viewer.lan", 200), (f"localhost:{port}", 200), ("rebound.example", 400)):
            answer = httpx.get(f"http://127.0.0.1:{port}/", headers={"Host": host}, timeout=5)
            assert answer.status_code == status, host
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert f"at http://localhost:{port}/ (read-only; Ctrl-C to stop)" in err


def test_run_summaries_print_the_view_command(run_dir, capsys):
    from flows.config import BatchConfig
    from flows.console import print_summary
    from tasks.statistics import summary_markdown

    config = BatchConfig.from_options(
        dataset_file="prompts.jsonl", batch_size=2, run_name=run_dir.name, output_dir=str(run_dir.parent)
    )
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert f"| view it | `hermes-batch view {run_dir}` |" in summary_markdown(config, stats).splitlines()
    from uuid import UUID

    from prefect.states import Completed

    state = Completed()
    state.state_details.flow_run_id = UUID(TEST_FLOW_RUN_ID)
    print_summary(config, state=state)
    assert f"View it: hermes-batch view {run_dir}" in capsys.readouterr().out.replace("\n", "")


# --- scores (issue 25): two samples per record, answer and verify scorers, an infra failure ---

SCORED_ROW_RE = re.compile(
    r'<td class="idx">(\d+)</td>\s*<td class="sample">(\d+)</td>.*?<td class="score">(.*?)</td>', re.S
)
SCORED_LIST = [  # (prompt_index, sample_index, score column) of tests/flows/viewer/scored_run.py
    (0, 0, "pass 1.00"),
    (0, 1, "fail 0.00"),
    (1, 0, "pass 1.00"),
    (1, 1, "pass 1.00"),
    (2, 0, "fail 0.00"),
    (2, 1, "pass 1.00"),
    (3, 0, "errored"),
    (3, 1, "fail 0.00"),
    (4, 0, ""),
    (4, 1, ""),
]


def scored_listed(page: str) -> list[tuple[int, int, str]]:
    """(prompt_index, sample_index, score column text) of every row of a run page with samples."""
    return [
        (int(index), int(sample), re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cell)).strip())
        for index, sample, cell in SCORED_ROW_RE.findall(page)
    ]


@pytest.fixture(scope="module")
def scored_dir(tmp_path_factory) -> Path:
    return build_scored_run(tmp_path_factory.mktemp("scored"))


@pytest.fixture(scope="module")
def scored(scored_dir):
    with serve(create_app(scored_dir)) as url:
        yield url


def test_the_list_has_a_score_column_and_the_run_page_pass_at_k(scored):
    text = get(scored, "/").text
    assert scored_listed(text) == SCORED_LIST
    cards = [
        ("passed", 4, "passed (score)"),
        ("failed", 3, "failed (score)"),
        ("errored", 1, "errored (infrastructure)"),
    ]
    for outcome, n, label in cards:
        assert (
            f'<a class="card score-{outcome}" href="/?score={outcome}"><span class="n">{n}</span> {label}</a>'
            in text
        )
    # statistics.json: pass@1 = (1/2 + 1 + 1/2 + 0) / 4, pass@2 over records 0-2, pass^2 = 1/3
    assert "<tr><th>pass@1</th><td>0.5000</td></tr>" in text
    assert "<tr><th>pass@2</th><td>1.0000</td></tr>" in text
    assert "<tr><th>pass^2</th><td>0.3333 (every sample of a record passed)</td></tr>" in text
    assert "<tr><td>answer</td><td>5</td><td>3</td><td>2</td><td>60.00%</td><td>0.6</td></tr>" in text
    assert "<tr><td>verify</td><td>2</td><td>1</td><td>1</td><td>50.00%</td><td>0.5</td></tr>" in text
    # a sample's link names its sample
    assert '<a href="/prompt/0?sample=1">What is the capital of France?</a>' in text


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"score": "passed"}, [(0, 0), (1, 0), (1, 1), (2, 1)]),
        ({"score": "failed"}, [(0, 1), (2, 0), (3, 1)]),
        ({"score": "errored"}, [(3, 0)]),
        ({"score": "failed", "q": "capital"}, [(0, 1)]),
        ({"score": "passed", "status": "failed"}, []),
    ],
)
def test_the_list_filters_by_score(scored, params, expected):
    page = get(scored, "/", **params)
    assert page.status_code == 200
    assert [(i, s) for i, s, _ in scored_listed(page.text)] == expected
    assert f"{len(expected)} prompts match" in page.text


def test_an_unknown_score_filter_is_a_400(scored):
    answer = get(scored, "/", score="maybe")
    assert answer.status_code == 400 and "unknown score 'maybe'" in answer.text
    assert get(scored, "/prompt/0", sample="7").status_code == 404
    assert get(scored, "/prompt/0", sample="-1").status_code == 422


def test_the_trajectory_page_shows_the_scores_and_the_verify_output_as_text(scored):
    page = get(scored, "/prompt/2").text
    assert "<h2>Scores: failed</h2>" in page
    assert '<tr class="scorer-verify"><td class="scorer">verify</td><td class="value">0.0</td>' in page
    # the verify command's output, preformatted and escaped (its markup is text)
    assert (
        '<td class="explanation"><pre>exit 1: FAILED test_app.py::test_title - &lt;b&gt;assert&lt;/b&gt; '
        "&#39;Hello&#39; == &#34;Hi&#34;\n1 failed in 0.02s</pre></td>"
    ) in page
    assert "<b>assert" not in page
    sample = get(scored, "/prompt/0", sample="1").text
    assert "<h1>Prompt 0 · sample 1 " in sample
    assert "<pre>&#39;London&#39; is not one of [&#39;Paris&#39;]</pre>" in sample
    assert "<tr><th>sample</th><td>1</td></tr>" in sample
    # previous / next walk the samples, and keep the filter
    failed = get(scored, "/prompt/2", score="failed").text
    assert '<a rel="prev" href="/prompt/0?score=failed&amp;sample=1">← prompt 0 sample 1</a>' in failed
    assert '<a rel="next" href="/prompt/3?score=failed&amp;sample=1">prompt 3 sample 1 →</a>' in failed
    errored = get(scored, "/prompt/3").text
    assert '<span class="badge score-errored">errored</span>' in errored
    assert '<td class="error-type">SandboxError</td>' in errored and "Scores:" not in errored


def test_a_row_re_scored_through_scores_jsonl_shows_its_newest_score(tmp_path, monkeypatch):
    run_dir = build_scored_run(tmp_path)
    monkeypatch.setattr(run_index, "REFRESH_SECONDS", 0.0)
    with serve(create_app(run_dir)) as url:
        assert scored_listed(get(url, "/").text)[1] == (0, 1, "fail 0.00")
        # `hermes-batch score` appends a line: sample 1 of record 0 now passes its answer scorer
        new = {"value": 1.0, "passed": True, "explanation": "matches 'London' <i>(accepted now)</i>"}
        rescore(run_dir, prompt_ids(run_dir)[1], 0, {"answer": new})
        listed_now = scored_listed(get(url, "/").text)
        assert listed_now[1] == (0, 1, "pass 1.00") and listed_now[2:] == SCORED_LIST[2:]
        assert [(i, s) for i, s, _ in scored_listed(get(url, "/", score="passed").text)][:2] == [
            (0, 0),
            (0, 1),
        ]
        page = get(url, "/prompt/0", sample="1").text
        assert "<h2>Scores: passed</h2>" in page
        assert (
            '<td class="scorer">answer <span class="mark">re-scored</span></td><td class="value">1.0</td>'
            in page
        )
        assert "<pre>matches &#39;London&#39; &lt;i&gt;(accepted now)&lt;/i&gt;</pre>" in page
        # a later line for the same scorer wins; a torn last line (a killed score) is ignored
        rescore(run_dir, prompt_ids(run_dir)[1], 0, {"answer": {**new, "value": 0.0, "passed": False}})
        with open(run_dir / "scores.jsonl", "a", encoding="utf-8") as fh:
            fh.write('{"prompt_id": "' + prompt_ids(run_dir)[1] + '", "score": {"answ')
        assert scored_listed(get(url, "/").text)[1] == (0, 1, "fail 0.00")
        assert '<span class="mark">re-scored</span>' in get(url, "/prompt/0", sample="1").text


def test_rows_the_keep_filter_rejected_are_listed_as_rejected(tmp_path):
    run_dir = build_scored_run(tmp_path, keep="passed")
    index = RunIndex.open(run_dir, valid_tools=ALL_POSSIBLE_TOOLS)
    assert index.counts() == {
        "kept": 4, "rejected": 5, "discarded": 0, "filtered": 0, "failed": 1, "pending": 0,
    }  # fmt: skip
    rejected = index.select(run_index.Filters(status="rejected"))
    assert rejected.select("prompt_index", "sample_index", "score").rows() == [
        (0, 1, "failed"), (2, 0, "failed"), (3, 1, "failed"), (4, 0, None), (4, 1, None),
    ]  # fmt: skip
