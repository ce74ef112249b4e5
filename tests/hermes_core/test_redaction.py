"""Secret redaction (docs/security.md): known values and credential-named variables become [REDACTED]."""

from __future__ import annotations

import json

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
