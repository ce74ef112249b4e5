"""The scorers of :mod:`hermes_core.scoring`: the answer match, the record checks, and ``verify`` in a real sandbox."""

from __future__ import annotations

import sys

import pytest

from hermes_core.dataset import DatasetError, read_dataset
from hermes_core.environments.local import LocalEnvironment
from hermes_core.scoring import (
    JUDGE_REPLY_RULE,
    JUDGE_RUBRIC,
    VERIFY_EXPLANATION_CHARS,
    applied_scorers,
    check_record_fields,
    check_scorers,
    describe_scores,
    final_answers,
    judge_messages,
    normalise_answer,
    read_verdict,
    score_answer,
    score_python,
    score_verify,
)


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ('  "Paris."  ', "paris"),
        ("**42**", "42"),
        ("`x = 1`", "x = 1"),
        ("Hello,\n\t  World!", "hello, world"),
        ("«Ça va»", "ça va"),
        ("ＡＢＣ", "abc"),  # NFKC: full-width letters
        ("3.14", "3.14"),  # punctuation inside is kept
        ("...", ""),
    ],
)
def test_normalise_answer(text, normalised):
    assert normalise_answer(text) == normalised


def test_final_answers_are_the_text_without_reasoning_and_the_last_answer_line():
    text = "<think>\nANSWER: wrong\n</think>\nWorking.\nANSWER: 7\nanswer:  42 \nThanks"
    assert final_answers(text) == ["Working.\nANSWER: 7\nanswer:  42 \nThanks", "42"]
    assert final_answers("<REASONING_SCRATCHPAD>x</REASONING_SCRATCHPAD>\nJust this") == ["Just this"]


@pytest.mark.parametrize(
    ("final", "answer", "passed"),
    [
        ("Paris.", "paris", True),
        ("The capital is Paris.", "Paris", False),  # the whole text is not the answer...
        ("The capital is:\nANSWER: Paris.", "Paris", True),  # ...unless an ANSWER: line says it
        ("London", ["Paris", "paris, france"], False),
        ("Paris, France", ["Paris", "paris, france"], True),
        ("", "Paris", False),
        (None, "Paris", False),
    ],
)
def test_score_answer(final, answer, passed):
    score = score_answer(final, answer)
    assert score["passed"] is passed
    assert score["value"] == (1.0 if passed else 0.0)
    assert score["explanation"]


def test_the_explanations_say_what_matched_and_what_did_not():
    assert score_answer("ANSWER: 42", "42")["explanation"] == "matches '42'"
    assert score_answer("41", ["42", "forty-two"])["explanation"] == "'41' is not one of ['42', 'forty-two']"
    assert score_answer("  ", "42")["explanation"] == "no final answer"


def test_auto_is_verify_else_answer_and_a_scorer_needs_its_field():
    both = {"answer": "x", "verify": "true"}
    assert applied_scorers(["auto"], both) == ["verify"]
    assert applied_scorers(["auto"], {"answer": "x"}) == ["answer"]
    assert applied_scorers(["auto"], {}) == []
    assert applied_scorers(["answer", "verify"], both) == ["answer", "verify"]
    assert applied_scorers(["verify", "auto"], both) == ["verify"]  # auto adds nothing new
    assert applied_scorers(["verify"], {"answer": "x"}) == []


def test_check_scorers(tmp_path, monkeypatch):
    assert check_scorers([]) == ["auto"]
    assert check_scorers(["answer", "verify", "answer", "judge"]) == ["answer", "verify", "judge"]
    with pytest.raises(ValueError, match=r"unknown scorer 'jury' \(choose from auto, answer, verify, judge"):
        check_scorers(["answer", "jury"])
    # a python: scorer is imported when named, from the current folder too
    (tmp_path / "my_scorers_mod.py").write_text("def exact(row, record):\n    return {'passed': True}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert check_scorers(["python:my_scorers_mod:exact"]) == ["python:my_scorers_mod:exact"]
    with pytest.raises(ValueError, match=r"my_scorers_mod has no function 'missing'"):
        check_scorers(["python:my_scorers_mod:missing"])
    with pytest.raises(ValueError, match=r"cannot import 'no_such_scorer_mod'"):
        check_scorers(["python:no_such_scorer_mod:f"])
    with pytest.raises(ValueError, match=r"write it as python:module:function"):
        check_scorers(["python:justone"])


def test_judge_and_python_scorers_apply_to_every_record():
    assert applied_scorers(["judge", "python:m:f", "answer"], {}) == ["judge", "python:m:f"]
    assert applied_scorers(["auto", "judge"], {"answer": "4"}) == ["answer", "judge"]


def test_a_python_scorer_gets_the_row_and_the_record(tmp_path, monkeypatch):
    (tmp_path / "scorer_rows_mod.py").write_text(
        "def length(row, record):\n"
        "    n = len(row['conversations'])\n"
        "    return {'value': n / 10, 'passed': record['answer'] == 'x', 'explanation': f'{n} turns'}\n"
        "def broken(row, record):\n"
        "    raise KeyError('oops')\n"
        "def vague(row, record):\n"
        "    return {'passed': 'yes'}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    row = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    assert score_python("python:scorer_rows_mod:length", row, {"prompt": "q", "answer": "x"}) == {
        "value": 0.2,
        "passed": True,
        "explanation": "2 turns",
    }
    # a function that raises or answers badly: not passed, errored, the paid row kept
    assert score_python("python:scorer_rows_mod:broken", row, {}) == {
        "value": 0.0,
        "passed": False,
        "explanation": "scorer error: KeyError: 'oops'",
        "errored": True,
    }
    vague = score_python("python:scorer_rows_mod:vague", row, {})
    assert vague["errored"] is True and "'passed' must be a bool, not str" in vague["explanation"]


@pytest.mark.parametrize(
    ("reply", "passed", "explanation"),
    [
        ("PASS\nThe answer is right.", True, "The answer is right."),
        ("fail: wrong city", False, "wrong city"),
        ("**Verdict: PASS** - matches", True, "matches"),
        ("<think>hmm FAIL?</think>PASS", True, "PASS"),
        ("I think it passes", False, "the judge gave no verdict: 'I think it passes'"),
        (None, False, "the judge gave no verdict: ''"),
    ],
)
def test_read_verdict(reply, passed, explanation):
    assert read_verdict(reply) == {"value": float(passed), "passed": passed, "explanation": explanation}


def test_the_judge_sees_the_rubric_the_task_the_reference_and_the_final_answer():
    system, user = judge_messages(
        "Capital of France?", "<think>easy</think>Paris", ["Paris", "paris"], "Be fair."
    )
    assert system == {"role": "system", "content": f"Be fair.\n\n{JUDGE_REPLY_RULE}"}
    assert user["content"] == (
        "## Task\nCapital of France?\n\n## Reference answer\nParis | paris\n\n"
        "## Final answer of the agent\nParis\n"
    )
    assert "(none given)" in judge_messages("t", "", None, JUDGE_RUBRIC)[1]["content"]
    assert "(no final answer)" in judge_messages("t", None, None, JUDGE_RUBRIC)[1]["content"]


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"answer": "x", "verify": "true"}, None),
        ({"answer": ["x", "y"]}, None),
        ({"answer": None, "verify": None}, None),
        ({"answer": []}, "'answer' is an empty list"),
        ({"answer": ["x", 3]}, "'answer' must be a string or a list of strings"),
        ({"answer": 42}, "'answer' must be a string or a list of strings"),
        ({"answer": " "}, "'answer' holds an empty string"),
        ({"verify": ["ls"]}, "'verify' must be a string (a shell command)"),
        ({"verify": ""}, "'verify' is empty"),
    ],
)
def test_check_record_fields(record, reason):
    assert check_record_fields(record) == reason


def test_a_bad_answer_or_verify_is_a_dataset_error_with_its_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "a", "answer": "ok"}\n\n{"prompt": "b", "answer": []}\n{"prompt": "c", "verify": 1}\n',
        encoding="utf-8",
    )
    with pytest.raises(DatasetError) as raised:
        read_dataset(path)
    assert raised.value.errors == [
        (3, "'answer' is an empty list"),
        (4, "'verify' must be a string (a shell command)"),
    ]
    kept = read_dataset(path, skip_invalid=True)
    assert [record.source for record in kept.records] == [{"answer": "ok"}]


def test_describe_scores():
    scores = {"answer": {"scored": 2, "passed": 1, "failed": 1, "mean": 0.5}}
    assert describe_scores(scores) == "answer 1/2 passed (mean 0.5)"
    assert describe_scores({}) == ""


# -- verify, in a real sandbox (bubblewrap when installed, as a run uses) --------------------------


@pytest.fixture
def env():
    with LocalEnvironment() as environment:
        yield environment


def test_verify_sees_the_agents_files_and_exit_0_passes(env):
    env.write_file("out.txt", b"42\n")
    score = score_verify(env, "grep -qx 42 out.txt && echo verified", timeout=30)
    assert score == {"value": 1.0, "passed": True, "explanation": "exit 0: verified"}


def test_a_failing_verify_fails_with_its_status_and_output(env):
    score = score_verify(env, "echo missing >&2; exit 3", timeout=30)
    assert score == {"value": 0.0, "passed": False, "explanation": "exit 3: missing"}


def test_a_verify_past_its_timeout_is_stopped_and_fails(env):
    score = score_verify(env, "sleep 30", timeout=1)
    assert score == {"value": 0.0, "passed": False, "explanation": "timed out after 1 s"}


def test_the_verify_output_kept_is_bounded(env):
    score = score_verify(env, "head -c 100000 /dev/zero | tr '\\0' a", timeout=30)
    assert score["passed"] is True
    kept = score["explanation"].removeprefix("exit 0: ")
    assert len(kept) <= VERIFY_EXPLANATION_CHARS + len("\n[...]\n")
    assert kept.startswith("a" * 100) and kept.endswith("a" * 100) and "\n[...]\n" in kept
