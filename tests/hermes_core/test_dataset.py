"""Tests of hermes_core.dataset.read_dataset on small hand-written files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hermes_core.dataset import DatasetError, PromptRecord, read_dataset


def _write(tmp_path: Path, data: bytes | str, name: str = "ds.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def _key(obj: dict, occurrence: int = 0) -> str:
    canonical = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(f"{canonical}#{occurrence}".encode()).hexdigest()[:32]


def test_valid_file_fields_and_source(tmp_path):
    lines = [
        {"prompt": "List files", "image": "python:3.11", "cwd": "/work", "id": 7, "tags": ["a"]},
        {"prompt": "Héllo 世界", "docker_image": "alpine:3", "z": 1, "a": 2},
        {"prompt": "both", "image": "", "docker_image": "debian:12"},
        {"prompt": "plain", "image": None},
    ]
    path = _write(tmp_path, "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    ds = read_dataset(path)

    assert ds.path == str(path)
    assert ds.invalid == []
    assert ds.fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ds.records[0] == PromptRecord(
        prompt_index=0,
        line=1,
        prompt="List files",
        image="python:3.11",
        cwd="/work",
        source={"id": 7, "tags": ["a"]},
        content_key=_key(lines[0]),
    )
    second = ds.records[1]
    assert (second.prompt, second.image, second.cwd) == ("Héllo 世界", "alpine:3", None)
    assert list(second.source) == ["z", "a"]  # original order kept
    assert ds.records[2].image == "debian:12"  # first non-empty wins
    assert ds.records[2].source == {}
    assert ds.records[3].image is None
    assert [r.prompt_index for r in ds.records] == [0, 1, 2, 3]
    assert all(len(r.content_key) == 32 for r in ds.records)


def test_bom_crlf_no_final_newline_and_blank_lines(tmp_path):
    data = b'\xef\xbb\xbf{"prompt": "a"}\r\n\r\n   \r\n{"prompt": "b"}\r\n\n\t\n{"prompt": "c"}'
    ds = read_dataset(_write(tmp_path, data))
    assert [(r.prompt, r.line, r.prompt_index) for r in ds.records] == [("a", 1, 0), ("b", 4, 1), ("c", 7, 2)]
    assert ds.records[0].content_key == _key({"prompt": "a"})


@pytest.mark.parametrize(
    ("bad_line", "reason_part"),
    [
        ("{not json", "not valid JSON"),
        ('["prompt", "x"]', "not a JSON object (got array)"),
        ('"just a string"', "not a JSON object (got string)"),
        ('{"text": "no prompt"}', "missing 'prompt'"),
        ('{"prompt": 42}', "'prompt' must be a string (got number)"),
        ('{"prompt": null}', "'prompt' must be a string (got null)"),
        ('{"prompt": ""}', "'prompt' is empty"),
        ('{"prompt": "  \\n\\t "}', "'prompt' is empty"),
        ('{"prompt": "x", "image": 3}', "'image' must be a string (got number)"),
        ('{"prompt": "x", "docker_image": ["a"]}', "'docker_image' must be a string (got array)"),
        ('{"prompt": "x", "cwd": {"p": 1}}', "'cwd' must be a string (got object)"),
    ],
)
def test_each_invalid_kind_names_its_line(tmp_path, bad_line, reason_part):
    # blank line 2 and CRLF must not shift the numbering: the bad line is line 4
    data = '{"prompt": "ok"}\r\n\r\n{"prompt": "ok2"}\r\n' + bad_line + '\r\n{"prompt": "ok3"}\n'
    path = _write(tmp_path, data)
    with pytest.raises(DatasetError) as info:
        read_dataset(path)
    assert len(info.value.errors) == 1
    line, reason = info.value.errors[0]
    assert line == 4
    assert reason_part in reason
    assert str(path) in str(info.value)
    assert "line 4: " in str(info.value)

    ds = read_dataset(path, skip_invalid=True)
    assert [r.prompt for r in ds.records] == ["ok", "ok2", "ok3"]
    assert [r.line for r in ds.records] == [1, 3, 5]
    assert [r.prompt_index for r in ds.records] == [0, 1, 2]
    assert ds.invalid == [(4, reason)]


def test_error_lists_first_ten_then_count(tmp_path):
    data = "".join("{bad\n" if i % 2 else f'{{"prompt": "p{i}"}}\n' for i in range(30))
    with pytest.raises(DatasetError) as info:
        read_dataset(_write(tmp_path, data))
    err = info.value
    assert [line for line, _ in err.errors] == list(range(2, 31, 2))
    text = str(err)
    assert "15 invalid line(s)" in text
    assert "line 20: " in text and "line 22: " not in text
    assert text.endswith("... and 5 more")


def test_max_samples_keeps_first_valid_records(tmp_path):
    data = '{"prompt": "a"}\n{bad\n{"prompt": "b"}\n\n{"prompt": "c"}\n{"prompt": "d"}\n'
    path = _write(tmp_path, data)
    ds = read_dataset(path, max_samples=2, skip_invalid=True)
    assert [(r.prompt, r.prompt_index, r.line) for r in ds.records] == [("a", 0, 1), ("b", 1, 3)]
    assert ds.fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()
    full = read_dataset(path, skip_invalid=True)
    assert [r.content_key for r in full.records[:2]] == [r.content_key for r in ds.records]
    assert len(read_dataset(path, max_samples=100, skip_invalid=True).records) == 4
    # an invalid line after the first N is still reported: validity does not depend on max_samples
    with pytest.raises(DatasetError):
        read_dataset(_write(tmp_path, '{"prompt": "a"}\n{bad\n', "b.jsonl"), max_samples=1)
    with pytest.raises(ValueError, match="max_samples"):
        read_dataset(path, max_samples=0)


def test_duplicates_get_distinct_keys_and_reordering_keeps_them(tmp_path):
    a = {"prompt": "same", "id": 1}
    b = {"prompt": "other"}
    original = [a, b, a, {"id": 1, "prompt": "same"}]  # key order does not change the content
    ds = read_dataset(_write(tmp_path, "".join(json.dumps(x) + "\n" for x in original), "one.jsonl"))
    keys = [r.content_key for r in ds.records]
    assert len(ds.records) == 4  # duplicates are not collapsed
    assert keys == [_key(a, 0), _key(b, 0), _key(a, 1), _key(a, 2)]
    assert len(set(keys)) == 4

    reordered = [b, a, a, a]
    ds2 = read_dataset(_write(tmp_path, "".join(json.dumps(x) + "\n" for x in reordered), "two.jsonl"))
    assert [r.content_key for r in ds2.records] == [_key(b, 0), _key(a, 0), _key(a, 1), _key(a, 2)]
    assert set(r.content_key for r in ds2.records) == set(keys)


def test_not_utf8_names_the_line(tmp_path):
    data = b'{"prompt": "a"}\n\n{"prompt": "caf\xe9"}\n{"prompt": "b"}\n'
    for skip in (False, True):
        with pytest.raises(DatasetError, match=r"line 3 is not valid UTF-8"):
            read_dataset(_write(tmp_path, data), skip_invalid=skip)


def test_missing_file_and_directory(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match="nope.jsonl: dataset file not found") as info:
        read_dataset(missing)
    assert info.value.path == str(missing)
    with pytest.raises(DatasetError, match="not a regular file"):
        read_dataset(tmp_path)


@pytest.mark.parametrize("data", [b"", b"\n\n  \n", b"\xef\xbb\xbf"])
def test_empty_dataset_is_an_error(tmp_path, data):
    with pytest.raises(DatasetError, match="no valid records"):
        read_dataset(_write(tmp_path, data))


def test_all_invalid_with_skip_is_an_error(tmp_path):
    with pytest.raises(DatasetError, match="no valid records") as info:
        read_dataset(_write(tmp_path, '{"prompt": ""}\n[1]\n'), skip_invalid=True)
    assert [line for line, _ in info.value.errors] == [1, 2]


def test_path_with_glob_characters(tmp_path):
    path = _write(tmp_path, '{"prompt": "x"}\n', "data[1]*.jsonl")
    assert read_dataset(path).records[0].prompt == "x"


def test_line_numbers_across_blocks(tmp_path, monkeypatch):
    # lines cut by the reader's block boundaries (blocks of 97 bytes), blank lines sprinkled in
    monkeypatch.setattr("hermes_core.dataset._BLOCK_BYTES", 97)
    parts = []
    expected = []
    for i in range(10_000):
        if i % 7 == 3:
            parts.append("\r\n")
        else:
            parts.append(json.dumps({"prompt": f"p{i}"}) + "\r\n")
            expected.append((f"p{i}", i + 1))
    ds = read_dataset(_write(tmp_path, "".join(parts)))
    assert [(r.prompt, r.line) for r in ds.records] == expected


def test_records_stay_on_disk_and_are_read_when_used(tmp_path, monkeypatch):
    """The code path of a 10^6-record dataset at small scale: index entries only, records read back."""
    monkeypatch.setattr("hermes_core.dataset._BLOCK_BYTES", 64)
    lines = [{"prompt": f"p{i} " + "x" * (i * 37 % 300), "n": i} for i in range(200)]
    lines[50] = {"prompt": "dup", "image": "alpine:3"}
    lines[120] = {"prompt": "dup", "image": "alpine:3"}
    lines[7]["cwd"] = "/w"
    path = _write(tmp_path, "\ufeff" + "".join(json.dumps(x) + "\r\n" for x in lines))
    ds = read_dataset(path)
    assert len(ds) == len(ds.records) == 200
    assert ds.fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ds.content_key(50) == _key(lines[50], 0) and ds.content_key(120) == _key(lines[120], 1)
    assert list(ds.content_keys()) == [r.content_key for r in ds.records]
    assert (ds.image(50), ds.image(7), ds.image(8)) == ("alpine:3", None, None)
    for i in (0, 7, 50, 199):
        record = ds.record(i)
        assert (record.prompt, record.line, record.prompt_index) == (lines[i]["prompt"], i + 1, i)
        assert record.content_key == ds.content_key(i)
    assert ds.record(7).cwd == "/w" and ds.records[-1] == ds.record(199)
    assert [r.prompt for r in ds.records[198:]] == [lines[198]["prompt"], lines[199]["prompt"]]
    with pytest.raises(IndexError):
        ds.record(200)
    with open(path, "ab") as fh:
        fh.write(b'{"prompt": "late"}\n')
    with pytest.raises(DatasetError, match="changed after it was read"):
        ds.record(0)


def test_reuse_returns_the_same_dataset_while_the_file_is_unchanged(tmp_path):
    path = _write(tmp_path, '{"prompt": "a"}\n')
    first = read_dataset(path, reuse=True)
    assert read_dataset(path, reuse=True) is first  # the command line's check, then its flow
    assert read_dataset(path) is not first and read_dataset(path, reuse=True, max_samples=1) is not first
    with open(path, "a") as fh:
        fh.write('{"prompt": "b"}\n')
    assert len(read_dataset(path, reuse=True)) == 2


def test_fast_canonical_form_is_the_exact_one_or_declines(tmp_path):
    """Identities never depend on orjson: its form equals json's, else the exact path is taken."""
    import random

    from hermes_core.dataset import canonical_json, fast_canonical_json

    rng = random.Random(3)
    alphabet = [
        chr(c) for c in [*range(0x80), 0x9F, 0xA0, 0xE9, 0x2028, 0xFEFF, 0xFFFF, 0x4E16, 0x1F600, 0x10FFFF]
    ]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        key = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3)))
        obj = {"prompt": text, key: [text, 0, -5, True, None, {"z": text, "a": []}], "n": 2**63 - 1}
        line = json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode()
        fast, canonical = fast_canonical_json(line)
        assert fast == json.loads(line) and canonical == canonical_json(json.loads(line))
    for declined in [b'{"x": 1.5}', b'{"x": [1e-05]}', b'{"x": 18446744073709551616}', b'{"x": NaN}',
                     b'{"x": "\\ud800"}', b"[1]", b"\xe9", b"  ", b"{bad"]:  # fmt: skip
        assert fast_canonical_json(declined) == (None, None)
    # records that take the exact path keep their exact identities
    lines = [{"prompt": "f", "score": 0.1}, {"prompt": "big", "n": 2**70}]
    ds = read_dataset(_write(tmp_path, "".join(json.dumps(x) + "\n" for x in lines)))
    assert [r.content_key for r in ds.records] == [_key(lines[0]), _key(lines[1])]


@pytest.mark.parametrize(
    "bad_line",
    [
        '{"prompt": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",  # well formed, too deep
        '{"prompt": "deep", "x": ' + "[" * 100_000 + "}",  # and cut off
        '{"prompt": "deep", "x": ' + '{"a": ' * 70 + "1" + "}" * 70 + "}",  # just over the limit
    ],
)
def test_a_line_nested_too_deep_is_a_line_error_not_a_recursion_error(tmp_path, bad_line):
    path = _write(tmp_path, '{"prompt": "ok"}\n' + bad_line + "\n")
    with pytest.raises(DatasetError) as info:
        read_dataset(path)
    [(line, reason)] = info.value.errors
    assert line == 2 and ("nested more than 64 levels" in reason or "invalid JSON" in reason), reason
    assert [r.prompt for r in read_dataset(path, skip_invalid=True).records] == ["ok"]


def test_deep_but_allowed_nesting_is_kept(tmp_path):
    nested = '{"a": ' * 60 + "1" + "}" * 60
    path = _write(tmp_path, '{"prompt": "ok", "meta": ' + nested + "}\n")
    assert [r.prompt for r in read_dataset(path).records] == ["ok"]


def test_lone_surrogates_in_a_record_become_the_replacement_character(tmp_path):
    path = _write(
        tmp_path, '{"prompt": "a \\ud800 b", "cwd": "w\\udfff"}\n{"prompt": "pair \\ud83d\\ude00"}\n'
    )
    records = read_dataset(path).records
    assert [r.prompt for r in records] == ["a \ufffd b", "pair \U0001f600"]  # a real pair stays an emoji
    assert records[0].cwd == "w\ufffd"
    assert all(r.prompt.encode("utf-8") for r in records)


def test_check_cwds_names_the_file_and_each_refused_line(tmp_path):
    """The run's cwd check (command line preflight and the read-dataset task): one error, every line."""
    from flows.config import BatchConfig
    from hermes_core.dataset import DatasetError, read_dataset
    from hermes_core.runfolder.run_info import check_cwds
    from hermes_core.settings import HermesSettings

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a"}\n{"prompt": "b", "cwd": "/proc"}\n{"prompt": "c", "cwd": "work"}\n')
    config = BatchConfig.from_options(
        dataset_file=str(data), batch_size=1, run_name="r", output_dir=str(tmp_path / "data")
    )
    settings = HermesSettings(terminal_env="local")
    with pytest.raises(DatasetError) as refused:
        check_cwds(config, read_dataset(data), settings)
    text = str(refused.value)
    assert str(data) in text and "1 record(s) with a cwd the local sandbox refuses" in text
    assert "line 2: cwd '/proc' is refused" in text and "line 3" not in text
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"prompt": "c", "cwd": "work"}\n')
    check_cwds(config.model_copy(update={"dataset_file": str(ok)}), read_dataset(ok), settings)  # no error
