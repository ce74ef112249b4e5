"""Secret redaction (docs/security.md): known values and credential-named variables become [REDACTED]."""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest
from pydantic import BaseModel, SecretStr

from hermes_core import redaction
from hermes_core.redaction import REDACTED, Redactor, credential_values


def test_redactor_replaces_every_occurrence_and_longest_first():
    r = Redactor(["abcd1234", "abcd1234-long-suffix"])
    assert r.redact("x abcd1234-long-suffix y abcd1234 z") == f"x {REDACTED} y {REDACTED} z"
    text = "nothing secret here"
    assert r.redact(text) is text


def test_json_escaped_form_is_redacted_too():
    secret = 'p"ss\\word-42'
    r = Redactor([secret])
    encoded = json.dumps({"output": f"KEY={secret}"})
    assert secret not in json.loads(r.redact(encoded))["output"]
    assert json.loads(r.redact(encoded)) == {"output": f"KEY={REDACTED}"}


def test_short_secrets_are_ignored():
    assert len(Redactor(["abc"])) == 0
    assert Redactor(["abc"]).redact("abc") == "abc"


def test_credential_names_and_minimum_length():
    environ = {
        "OPENROUTER_API_KEY": "sk-or-12345678",
        "GITHUB_TOKEN": "ghp_abcdefgh",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "DB_PASSWORD": "hunter2hunter2",
        "FAL_KEY": "fal-12345678",
        "SHORT_TOKEN": "1234567",  # 7 characters: not a secret
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
    }
    assert sorted(credential_values(environ)) == sorted(
        ["sk-or-12345678", "ghp_abcdefgh", "wJalrXUtnFEMI/K7MDENG", "hunter2hunter2", "fal-12345678"]
    )


def test_process_redactor_sees_environment_and_registered_values(monkeypatch):
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-9876543210")
    redaction.refresh()
    redaction.register_secret(SecretStr("given-by-flag-1234"))

    class Settings(BaseModel):
        api_key: SecretStr | None = SecretStr("from-settings-5678")
        other: str = "not-a-secret-value"

    redaction.register_secrets_of(Settings())
    text = "tok-9876543210 given-by-flag-1234 from-settings-5678 not-a-secret-value"
    assert redaction.redact(text) == f"{REDACTED} {REDACTED} {REDACTED} not-a-secret-value"
    assert redaction.redactor().redact_obj({"k": ["tok-9876543210", 3]}) == {"k": [REDACTED, 3]}


KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"  # has "/" and "+": its URL-encoded forms differ


@pytest.mark.parametrize(
    "form",
    [
        KEY.encode().hex(),  # xxd -p, od
        KEY.encode().hex().upper(),
        KEY[::-1],  # rev
        urllib.parse.quote(KEY, safe=""),  # %2F, %2B
        urllib.parse.quote_plus(KEY, safe=""),
    ],
    ids=["hex", "HEX", "reversed", "url-encoded", "url-encoded-plus"],
)
def test_each_plain_encoding_of_a_secret_is_redacted(form):
    assert form != KEY and form in f"run: {form}."
    assert Redactor([KEY]).redact(f"run: {form}.") == f"run: {REDACTED}."


@pytest.mark.parametrize("offset", [0, 1, 2])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode], ids=["base64", "base64url"])
def test_a_secret_base64_encoded_inside_a_longer_text_is_redacted_at_each_offset(encode, offset):
    """``printf 'x=%s\\n' "$KEY" | base64``: where the key starts in the 3-byte groups depends on what precedes it."""
    before, after = b"K=" + b"x" * offset, b" was the key\n"
    encoded = encode(before + KEY.encode() + after).decode()
    redacted = Redactor([KEY]).redact(f"output: {encoded}")
    assert redacted.count(REDACTED) == 1 and redacted.startswith("output: ")
    kept = redacted.removeprefix("output: ").split(REDACTED)
    # only the groups that mix the key's bytes with its neighbours' are kept: 4 characters at most each side
    assert len(kept[0]) <= len(encode(before)) + 4 and len(kept[1]) <= len(encode(after)) + 4
    for piece in kept:  # and no part of the key can be read back from them
        padded = piece[: len(piece) // 4 * 4]
        assert KEY[:4].encode() not in base64.b64decode(
            padded, altchars=b"-_" if encode is not base64.b64encode else None
        )


def test_a_secret_in_the_models_answer_is_redacted_in_every_encoding_at_once():
    forms = [
        KEY.encode().hex(),
        KEY[::-1],
        urllib.parse.quote(KEY, safe=""),
        base64.b64encode(KEY.encode()).decode(),
    ]
    answer = "Here it is: " + " / ".join(forms)
    assert Redactor([KEY]).redact(answer) == "Here it is: " + " / ".join([REDACTED] * 4)
