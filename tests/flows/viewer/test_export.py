"""``hermes-batch export``: Parquet shards + dataset card loaded back with ``datasets`` (offline),
the chat-messages format, ``--include all``, scores (typed columns, ``--include passed``, pass@k in
the card, re-scores of ``scores.jsonl``), secret redaction, errors, ``--push_to_hub``
against a stand-in for the Hub's upload endpoints, and what ``--out`` / ``--overwrite`` may
touch (only files an earlier export listed in its manifest; never a run or output folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from flows.cli import main
from flows.viewer.export import MANIFEST, export_run
from flows.viewer.index import Filters, RunIndex
from hermes_core import redaction
from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tests.flows.viewer.scored_run import VERIFY_FAIL, build_scored_run, prompt_ids, rescore
from tests.hub_standin import HubRecord, hub_app
from tests.live_app import serve
from tests.run_folders import LEAK, TERMINAL_TOOL, build_run

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def offline_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("export"))


def _cache(path: Path) -> str:
    """A fresh datasets cache beside ``path``: ``datasets`` fixes its default cache folder when it is
    first imported, and a cached copy of an older file at the same path must never be read back."""
    return str(path.parent / f".hf-cache-{path.name}-{time.monotonic_ns()}")


def load(folder: Path):
    import datasets

    return datasets.load_dataset(str(folder), split="train", cache_dir=_cache(folder))


def load_json(path: Path):
    import datasets

    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=_cache(path))


def card_front(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text(encoding="utf-8")
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def test_sharegpt_export_loads_like_trajectories_jsonl(run_dir, tmp_path):
    out = tmp_path / "ds"
    result = export_run(run_dir, out, valid_tools=ALL_POSSIBLE_TOOLS, shard_bytes=6_000)
    assert result.rows == 5 and len(result.shards) >= 2  # small shards: several files, one schema
    assert [p.name for p in result.shards] == [
        f"train-{n:05d}-of-{len(result.shards):05d}.parquet" for n in range(len(result.shards))
    ]
    exported, reference = load(out), load_json(run_dir / "trajectories.jsonl")
    assert len(exported) == len(reference) == 5
    assert exported.features == reference.features
    assert exported.to_list() == reference.to_list()
    assert [r["prompt_index"] for r in exported] == [0, 1, 5, 6, 7]


def test_card_front_matter_and_body(run_dir, tmp_path):
    out = tmp_path / "ds"
    export_run(run_dir, out, valid_tools=ALL_POSSIBLE_TOOLS)
    front, body = card_front(out)
    assert front["license"] == "other"
    assert front["size_categories"] == ["n<1K"]
    assert {"hermes-batch", "tool-use", "sharegpt"} <= set(front["tags"])
    assert front["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*.parquet"}]}
    ]
    names = [f["name"] for f in front["dataset_info"]["features"]]
    assert names == ["prompt_index", "conversations", "metadata", "completed", "partial", "api_calls",
                     "toolsets_used", "tool_stats", "tool_error_counts"]  # fmt: skip
    assert "`mock/scripted` (toolset distribution `terminal_only`). 5 rows." in body
    assert "| max_turns | 10 |" in body and "| batch_size | 2 |" in body
    assert "| 9 | 5 | 1 | 1 | 1 |" in body  # prompts, kept, discarded, filtered, failed
    assert "| terminal | 5 | 4 | 1 | 80.00 |" in body
    assert "9 of 11 assistant turns have reasoning (81.82%" in body
    assert "600 prompt, 120 completion (30 reasoning), 720 total tokens; cost $0.0060" in body
    export_run(run_dir, out, valid_tools=ALL_POSSIBLE_TOOLS, license="cc-by-4.0", overwrite=True)
    assert card_front(out)[0]["license"] == "cc-by-4.0"


def test_include_all_adds_the_hallucinated_tool_row_with_the_same_schema(run_dir, tmp_path):
    kept = export_run(run_dir, tmp_path / "kept", valid_tools=ALL_POSSIBLE_TOOLS)
    everything = export_run(run_dir, tmp_path / "all", valid_tools=ALL_POSSIBLE_TOOLS, include="all")
    assert (kept.rows, everything.rows, everything.filtered_included) == (5, 6, 1)
    rows = load(tmp_path / "all")
    assert rows.features == load(tmp_path / "kept").features
    assert [r["prompt_index"] for r in rows] == [0, 1, 3, 5, 6, 7]
    filtered = rows[2]
    assert list(filtered["tool_stats"]) == list(ALL_POSSIBLE_TOOLS)
    assert '"name": "hallucinated_tool"' in filtered["conversations"][2]["value"]
    assert "This export has 1 such rows." in card_front(tmp_path / "all")[1]


def test_messages_format(run_dir, tmp_path):
    out = tmp_path / "messages"
    export_run(run_dir, out, valid_tools=ALL_POSSIBLE_TOOLS, fmt="messages")
    rows = load(out)
    assert len(rows) == 5
    row = rows[0]  # prompt 0: "List the files ...", one terminal call, then the answer
    assert row["prompt_index"] == 0 and row["model"] == "mock/scripted" and row["completed"] is True
    assert row["tools"] == [TERMINAL_TOOL]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    system, user, call, result, answer = row["messages"]
    assert system["content"].startswith("You are a function-calling AI model.")
    assert user["content"] == "List the files in the working directory"
    assert call["content"] == "Running it." and call["reasoning"] == "I should run ls."
    assert call["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
        }
    ]
    assert result["tool_call_id"] == "call_1" and result["name"] == "terminal"
    assert json.loads(result["content"]) == {"output": "a.txt\nb.txt", "exit_code": 0, "error": None}
    assert (answer["content"], answer["reasoning"], answer["tool_calls"]) == (
        "Done: two files.",
        "Enough.",
        None,
    )
    front, _ = card_front(out)
    assert [f["name"] for f in front["dataset_info"]["features"]] == [
        "prompt_index", "prompt_id", "model", "completed", "partial", "messages", "tools"
    ]  # fmt: skip
    assert rows[3]["completed"] is True and rows[2]["completed"] is False  # prompts 6 and 5 (turn limit)


def test_every_exported_value_is_redacted(tmp_path, monkeypatch):
    run_dir = build_run(tmp_path, [("leak", "Print the environment"), ("kept", "Harmless")])
    assert LEAK in (run_dir / "trajectories.jsonl").read_text()  # the row holds it: export must scrub it
    monkeypatch.setenv("SERVICE_API_KEY", LEAK)
    redaction.refresh()
    try:
        for fmt in ("sharegpt", "messages"):
            out = tmp_path / fmt
            export_run(run_dir, out, valid_tools=ALL_POSSIBLE_TOOLS, fmt=fmt)
            dumped = json.dumps(pl.read_parquet(out / "data").to_dicts(), ensure_ascii=False, default=str)
            assert LEAK not in dumped and "SERVICE_API_KEY=[REDACTED]" in dumped
            assert LEAK not in (out / "README.md").read_text()
    finally:
        monkeypatch.delenv("SERVICE_API_KEY")
        redaction.refresh()


def test_export_command_and_its_errors(run_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["export", str(run_dir), "--out", str(out), "--format=messages"]) == 0
    assert capsys.readouterr().out.startswith(f"exported 5 rows (messages, kept) to {out}: 1 Parquet shards")
    assert main(["export", str(run_dir), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --out {out}: folder is not empty (pass --overwrite to replace an export)"
    )
    assert main(["export", str(run_dir), "--out", str(out), "--format", "csv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # argparse quotes the choices on newer Pythons
    assert len(err) == 1 and err[0].startswith("error: argument --format: invalid choice: 'csv' (choose from")
    assert main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {tmp_path / 'missing' / 'trajectories.jsonl'}: not found (the run has not been merged yet: "
        "let it finish or --resume it)"
    ]
    assert main(["export", str(run_dir)]) == 2
    assert capsys.readouterr().err.strip() == "error: the following arguments are required: --out"


@pytest.mark.slow  # starts the command line in a subprocess
def test_push_to_hub_uploads_the_folder(run_dir, tmp_path):
    record = HubRecord()
    out = tmp_path / "pushed"
    with serve(hub_app(record)) as endpoint:
        env = {
            **os.environ,
            "HF_ENDPOINT": endpoint,
            "HF_TOKEN": "hf_standin_token_0123456789",
            "HF_HUB_DISABLE_XET": "1",  # the stand-in speaks the plain commit API, not Xet storage
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        env.pop("HF_HUB_OFFLINE", None)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "flows.cli",
                "export",
                str(run_dir),
                f"--out={out}",
                "--push_to_hub",
                "me/trajs",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"uploaded to {endpoint}/datasets/me/trajs/commit/" in proc.stdout
    assert record.repos == [{"name": "trajs", "organization": "me", "type": "dataset"}]
    local = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert set(local) == {"README.md", "data/train-00000-of-00001.parquet", MANIFEST}
    assert record.files == {
        name: data for name, data in local.items() if name != MANIFEST
    }  # not the manifest
    assert record.authorizations == {"Bearer hf_standin_token_0123456789"}


def test_push_to_hub_without_token_is_one_line(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["export", str(run_dir), f"--out={tmp_path / 'o'}", "--push_to_hub=me/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --push_to_hub me/x: HF_TOKEN is not set (a write token of the Hub account)"


# --- what --out and --overwrite may touch -----------------------------------------------------


def tree(root: Path) -> dict[str, object]:
    """Every entry under ``root`` (links not followed): a file's bytes, ``"dir"``, or ``"-> target"``."""
    found: dict[str, object] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = path.read_bytes()
    return found


def refused(capsys, argv: list[str]) -> str:
    """Run ``hermes-batch export ARGV`` in this process; assert exit 2 and one ``error:`` line; return it."""
    assert main(["export", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def exported(out: Path, run_dir: Path, *extra: str) -> None:
    assert main(["export", str(run_dir), "--out", str(out), *extra]) == 0


@pytest.mark.slow  # starts the command line in a subprocess
def test_overwrite_from_the_project_root_deletes_nothing(tmp_path):
    """The reported case: ``export data/r --out . --overwrite`` from the project root deleted
    ``./data`` (every run) and ``README.md``, then raised a traceback."""
    project = tmp_path / "project"
    project.mkdir()
    build_run(project)  # project/data/demo, project/prompts.jsonl
    (project / "README.md").write_text("# my project\n")
    (project / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    before = tree(project)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    for extra in (["--overwrite"], []):
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "export", "data/demo", "--out", ".", *extra],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        assert proc.stderr.splitlines() == [
            "error: --out .: holds the output folder data (where run folders live): "
            "nothing was written or deleted; choose a folder outside it"
        ]
        assert tree(project) == before


def test_overwrite_leaves_what_the_export_did_not_write(run_dir, tmp_path, capsys):
    out = tmp_path / "ds"
    exported(out, run_dir)
    (out / "notes.txt").write_text("mine")
    (out / "data" / "mine.parquet").write_bytes(b"mine")
    (out / "sub").mkdir()
    before = tree(out)
    error = refused(capsys, [str(run_dir), "--out", str(out), "--overwrite"])
    assert error == (
        f"error: --out {out}: holds files an earlier export did not write (data/mine.parquet, notes.txt, "
        "sub): nothing was deleted; move them away or choose another folder"
    )
    assert tree(out) == before


def test_overwrite_refuses_a_folder_no_export_made(run_dir, tmp_path, capsys):
    out = tmp_path / "looks-like-an-export"
    (out / "data").mkdir(parents=True)
    (out / "README.md").write_text("my notes")
    (out / "data" / "train-00000-of-00001.parquet").write_bytes(b"not ours")
    before = tree(out)
    error = refused(capsys, [str(run_dir), "--out", str(out), "--overwrite"])
    assert error == (
        f"error: --out {out}: not a folder an export made (no {MANIFEST}): nothing was deleted; "
        "it holds README.md, data"
    )
    assert tree(out) == before
    error = refused(capsys, [str(run_dir), "--out", str(out)])
    assert error == (
        f"error: --out {out}: folder is not empty and no export made it (no {MANIFEST}): "
        "choose a new or empty folder"
    )
    assert tree(out) == before


@pytest.mark.parametrize(
    "target, reason",
    [
        ("{run}", "is the run folder {run}"),
        ("{run}/hf", "lies inside the run folder {run}"),
        ("{run}/logs/hf", "lies inside the run folder {run}"),
        ("{output}", "is the output folder {output} (where run folders live)"),
        ("{output}/hf", "lies inside the output folder {output} (where run folders live)"),
        ("{root}", "holds the output folder {output} (where run folders live)"),
    ],
)
@pytest.mark.parametrize("overwrite", [False, True])
def test_out_in_or_around_a_run_or_output_folder_is_refused(run_dir, target, reason, overwrite, capsys):
    names = {"run": run_dir, "output": run_dir.parent, "root": run_dir.parent.parent}
    out = target.format(**names)
    before = tree(names["root"])
    error = refused(capsys, [str(run_dir), "--out", out, *(["--overwrite"] if overwrite else [])])
    assert error == (
        f"error: --out {out}: {reason.format(**names)}: nothing was written or deleted; "
        "choose a folder outside it"
    )
    assert tree(names["root"]) == before


def test_out_holding_another_run_folder_is_refused(run_dir, tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    other = build_run(tmp_path / "elsewhere", run_name="other")  # elsewhere/data/other
    before = tree(tmp_path / "elsewhere")
    error = refused(capsys, [str(run_dir), "--out", str(other.parent), "--overwrite"])
    assert error == (
        f"error: --out {other.parent}: holds the run folder {other}: nothing was written or deleted; "
        "choose a folder outside it"
    )
    assert tree(tmp_path / "elsewhere") == before


def test_root_home_and_the_current_folder_are_refused(run_dir, tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "README.md").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    before = tree(home)
    for extra in ([], ["--overwrite"]):
        error = refused(capsys, [str(run_dir), "--out", str(home), *extra])
        assert error == f"error: --out {home}: is a home folder: choose a folder inside it"
        error = refused(capsys, [str(run_dir), "--out", "/", *extra])
        assert error == "error: --out /: is the root folder: choose a folder inside it"
    assert tree(home) == before
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("mine")
    monkeypatch.chdir(project)
    for out in (".", str(project)):
        error = refused(capsys, [str(run_dir), "--out", out, "--overwrite"])
        assert error == (
            f"error: --out {out}: is the current folder and no export made it (no {MANIFEST}): "
            "nothing was written or deleted; choose another folder"
        )
    assert tree(project) == {"README.md": b"mine"}


@pytest.mark.slow  # starts the command line in a subprocess
def test_overwrite_replaces_an_earlier_export_and_its_manifest_lists_every_file(run_dir, tmp_path):
    out = tmp_path / "ds"
    first = export_run(run_dir, out, valid_tools=ALL_POSSIBLE_TOOLS, shard_bytes=6_000)
    assert len(first.shards) >= 2
    manifest = json.loads((out / MANIFEST).read_text())
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert manifest["run"] == {"run_name": "demo", "run_id": run_id}
    assert manifest["complete"] is True
    assert manifest["files"] == ["README.md", *(f"data/{p.name}" for p in first.shards)]
    assert manifest["folders"] == ["data"]
    assert set(tree(out)) == {MANIFEST, "data", *manifest["files"]}
    # the current folder may be an export folder: overwrite it from inside, with fewer shards
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "export", str(run_dir), "--out", ".", "--overwrite"],
        cwd=out,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(tree(out)) == {MANIFEST, "README.md", "data", "data/train-00000-of-00001.parquet"}
    assert json.loads((out / MANIFEST).read_text())["files"] == [
        "README.md",
        "data/train-00000-of-00001.parquet",
    ]
    assert len(load(out)) == 5


def test_a_manifest_that_names_other_files_deletes_nothing(run_dir, tmp_path, capsys):
    out = tmp_path / "ds"
    exported(out, run_dir)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    manifest = json.loads((out / MANIFEST).read_text())
    for name in ("../victim.txt", "data/../../victim.txt", str(victim), "data", "run.json"):
        (out / MANIFEST).write_text(json.dumps({**manifest, "files": [*manifest["files"], name]}))
        before = tree(tmp_path)
        error = refused(capsys, [str(run_dir), "--out", str(out), "--overwrite"])
        assert error == (
            f"error: --out {out}: {out / MANIFEST} lists {name!r}, not a file an export writes: "
            "nothing was deleted"
        )
        assert tree(tmp_path) == before
    (out / MANIFEST).write_text("{not json")
    error = refused(capsys, [str(run_dir), "--out", str(out), "--overwrite"])
    assert error.startswith(f"error: --out {out}: {out / MANIFEST} is not valid JSON (")
    assert victim.read_text() == "keep me"


def test_a_linked_data_folder_is_not_followed(run_dir, tmp_path, capsys):
    out = tmp_path / "ds"
    exported(out, run_dir)
    elsewhere = tmp_path / "elsewhere"
    (out / "data").rename(elsewhere)
    (out / "data").symlink_to(elsewhere)
    before = tree(tmp_path)
    error = refused(capsys, [str(run_dir), "--out", str(out), "--overwrite"])
    assert error == (
        f"error: --out {out}: data is a symbolic link, not the folder an export made: nothing was deleted"
    )
    assert tree(tmp_path) == before


def test_an_unusable_out_is_one_line(run_dir, tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    error = refused(capsys, [str(run_dir), "--out", str(blocker)])
    assert error == f"error: --out {blocker}: exists and is not a folder"
    error = refused(capsys, [str(run_dir), "--out", str(blocker / "x")])
    assert error.startswith(f"error: --out {blocker / 'x'}: cannot be made (")
    assert blocker.read_text() == "x"


def test_a_failed_export_leaves_a_folder_overwrite_can_replace(run_dir, tmp_path, capsys):
    import shutil

    broken = tmp_path / "data" / "demo"
    shutil.copytree(run_dir, broken)
    merged = broken / "trajectories.jsonl"
    good = merged.read_bytes()
    merged.write_bytes(good + b"[1]\n")  # the 6th line is not an object: the export stops there
    out = tmp_path / "ds"
    error = refused(capsys, [str(broken), "--out", str(out)])
    assert error == f"error: {merged} line 6: not a JSON object"
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["complete"] is False and manifest["files"] == [".export-rows.jsonl"]
    assert set(tree(out)) == {MANIFEST, "data"}  # the temp file is gone, the folder is marked
    merged.write_bytes(good)
    assert main(["export", str(broken), "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / MANIFEST).read_text())["complete"] is True
    assert len(load(out)) == 5


# --- scores (issue 25): typed score columns, --include passed, pass@k in the card, re-scores ---

SCORE_TYPE = {"value": "float64", "passed": "bool", "explanation": "string"}
EXPORTED_SCORES = [  # (prompt_index, sample_index, passed, {scorer: (value, passed, explanation)}), see scored_run.py
    (0, 0, True, {"answer": (1.0, True, "matches 'Paris'")}),
    (0, 1, False, {"answer": (0.0, False, "'London' is not one of ['Paris']")}),
    (1, 0, True, {"answer": (1.0, True, "matches '42'")}),
    (1, 1, True, {"answer": (1.0, True, "matches '42'")}),
    (2, 0, False, {"verify": (0.0, False, VERIFY_FAIL["explanation"])}),
    (2, 1, True, {"verify": (1.0, True, "exit 0: 1 passed in 0.01s")}),
    (3, 1, False, {"answer": (0.0, False, "'y' is not one of ['x']")}),
    (4, 0, None, {}),
    (4, 1, None, {}),
]


@pytest.fixture(scope="module")
def scored_dir(tmp_path_factory) -> Path:
    return build_scored_run(tmp_path_factory.mktemp("export-scored"))


def scores_of(rows, meta=lambda r: r["metadata"]) -> list[tuple]:
    """EXPORTED_SCORES' form of loaded rows (a scorer that did not score a row is null: left out)."""
    return [
        (
            r["prompt_index"],
            meta(r)["sample_index"],
            meta(r)["passed"],
            {
                name: (s["value"], s["passed"], s["explanation"])
                for name, s in (meta(r)["score"] or {}).items()
                if s is not None
            },
        )
        for r in rows
    ]


def feature(front: dict, *path: str) -> dict:
    """The card's feature at ``path`` (names of nested struct fields)."""
    fields = front["dataset_info"]["features"]
    for name in path[:-1]:
        fields = next(f for f in fields if f["name"] == name)["struct"]
    return next(f for f in fields if f["name"] == path[-1])


def test_a_scored_export_loads_with_typed_score_columns(scored_dir, tmp_path):
    import datasets

    out = tmp_path / "scored"
    assert export_run(scored_dir, out, valid_tools=ALL_POSSIBLE_TOOLS).rows == 9
    rows = load(out)
    metadata = rows.features["metadata"]
    result = {name: datasets.Value(dtype) for name, dtype in SCORE_TYPE.items()}
    assert metadata["score"] == {"answer": result, "verify": result}
    assert metadata["passed"] == datasets.Value("bool") and metadata["sample_index"] == datasets.Value(
        "int64"
    )
    assert scores_of(rows) == EXPORTED_SCORES
    # the same values as trajectories.jsonl (where datasets' JSON loader gives an untyped Json feature)
    lines = [json.loads(line) for line in (scored_dir / "trajectories.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in (r["metadata"]["score"] or {}).items() if v is not None} for r in rows] == [
        line["metadata"].get("score", {}) for line in lines
    ]
    front, body = card_front(out)
    assert feature(front, "metadata", "score", "verify") == {
        "name": "verify", "struct": [{"name": n, "dtype": d} for n, d in SCORE_TYPE.items()]
    }  # fmt: skip
    assert feature(front, "metadata", "passed") == {"name": "passed", "dtype": "bool"}
    assert feature(front, "metadata", "sample_index") == {"name": "sample_index", "dtype": "int64"}
    # the card: pass@k and each scorer's pass rate, from statistics.json
    assert "pass@1 = 0.5 · pass@2 = 1.0 · pass^2 = 0.3333 (unbiased estimator" in body
    assert "| answer | 5 | 3 | 2 | 60.00% | 0.6 |" in body and "| verify | 2 | 1 | 1 | 50.00% | 0.5 |" in body


def test_include_passed_exports_exactly_the_passing_rows(scored_dir, tmp_path, capsys):
    out = tmp_path / "passed"
    assert main(["export", str(scored_dir), "--out", str(out), "--include", "passed"]) == 0
    assert capsys.readouterr().out.startswith(f"exported 4 rows (sharegpt, passed) to {out}")
    rows = load(out)
    assert scores_of(rows) == [row for row in EXPORTED_SCORES if row[2] is True]
    _, body = card_front(out)
    assert "Included: the rows of `trajectories.jsonl` whose `metadata.passed` is true" in body
    assert "`mock/scripted` (toolset distribution `terminal_only`). 4 rows." in body
    # the messages format carries the scores at the top level, typed the same way
    messages = tmp_path / "passed-messages"
    export_run(scored_dir, messages, valid_tools=ALL_POSSIBLE_TOOLS, fmt="messages", include="passed")
    loaded = load(messages)
    assert list(loaded.features)[-3:] == ["sample_index", "score", "passed"]
    assert scores_of(loaded, meta=lambda r: r) == [row for row in EXPORTED_SCORES if row[2] is True]
    # a run that nothing passed has nothing to export
    (tmp_path / "unscored").mkdir()
    unscored = build_run(tmp_path / "unscored", [("kept", "no scorer here")])
    assert main(["export", str(unscored), "--out", str(tmp_path / "none"), "--include=passed"]) == 2
    assert "no row passed its scorers (--include passed)" in capsys.readouterr().err


def test_a_row_re_scored_through_scores_jsonl_is_exported_with_its_newest_score(tmp_path):
    run_dir = build_scored_run(tmp_path)
    new = {"value": 1.0, "passed": True, "explanation": "matches 'London' (accepted now)"}
    rescore(run_dir, prompt_ids(run_dir)[1], 0, {"answer": new})  # record 0, sample 1 (failed)
    every = export_run(run_dir, tmp_path / "all", valid_tools=ALL_POSSIBLE_TOOLS)
    expected = list(EXPORTED_SCORES)
    expected[1] = (0, 1, True, {"answer": (1.0, True, "matches 'London' (accepted now)")})
    assert every.rows == 9 and scores_of(load(tmp_path / "all")) == expected
    export_run(run_dir, tmp_path / "passed", valid_tools=ALL_POSSIBLE_TOOLS, include="passed")
    assert scores_of(load(tmp_path / "passed")) == [row for row in expected if row[2] is True]


def test_hermes_batch_score_then_the_viewer_and_the_export_show_the_new_score(tmp_path, capsys):
    """The real ``hermes-batch score`` (a corrected dataset accepts London too) writes scores.jsonl."""
    run_dir = build_scored_run(tmp_path)
    records = [json.loads(line) for line in (tmp_path / "scored.jsonl").read_text().splitlines()]
    records[0]["answer"] = ["Paris", "London"]
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert main(["score", str(run_dir), "--scorer", "answer", "--dataset", str(fixed)]) == 0
    capsys.readouterr()
    expected = list(EXPORTED_SCORES)
    expected[1] = (0, 1, True, {"answer": (1.0, True, "matches 'London'")})
    index = RunIndex.open(run_dir, valid_tools=ALL_POSSIBLE_TOOLS)
    assert index.select(Filters(score="passed")).select("prompt_index", "sample_index").rows() == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 1),
    ]  # fmt: skip
    assert index.row(index.entry(0, 1))["metadata"]["score"]["answer"]["explanation"] == "matches 'London'"
    assert main(["export", str(run_dir), "--out", str(tmp_path / "passed"), "--include=passed"]) == 0
    assert scores_of(load(tmp_path / "passed")) == [row for row in expected if row[2] is True]
