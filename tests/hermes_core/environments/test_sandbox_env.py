"""Sandbox commands get an allow-listed environment: none of the host's secrets, plus what HERMES_SANDBOX_ENV lists.

The local cases run in a child Python process that has the secrets in its real (exec-time)
environment, so ``/proc/$PPID/environ`` would show them if a command's parent held them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest

from hermes_core.environments.sandbox_env import local_environment
from hermes_core.settings import HermesSettings

CHILD = r"""
import json, sys
from hermes_core.environments.local import LocalEnvironment
from hermes_core.settings import HermesSettings
with LocalEnvironment(settings=HermesSettings(local_isolation=sys.argv[1])) as env:
    out = env.execute("env; echo ---; tr '\\0' '\\n' < /proc/$PPID/environ; echo ---; tr '\\0' '\\n' < /proc/1/environ")
    print(json.dumps({"isolated": env.isolated, "cwd": env.cwd, "output": out.output}))
"""


def secrets_env() -> dict[str, str]:
    return {
        "OPENROUTER_API_KEY": "sk-or-" + secrets.token_hex(8),
        "AWS_SECRET_ACCESS_KEY": "aws-" + secrets.token_hex(8),
        "FOO_TOKEN": "foo-" + secrets.token_hex(8),
        "PREFECT_API_KEY": "pnu_" + secrets.token_hex(8),
    }


@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_local_commands_see_no_host_secret_but_the_listed_names(mode):
    if mode == "bwrap" and not shutil.which("bwrap") and os.environ.get("CI", "").lower() != "true":
        pytest.skip("bubblewrap (bwrap) is not installed")
    hidden = secrets_env()
    listed = "listed-" + secrets.token_hex(8)
    env = {**os.environ, **hidden, "MY_LISTED": listed, "HERMES_SANDBOX_ENV": "MY_LISTED,NOT_SET_ANYWHERE"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    result = json.loads(done.stdout)
    assert result["isolated"] is (mode == "bwrap")
    own_env, parent_env, init_env = result["output"].split("---\n")
    for value in hidden.values():
        assert value not in result["output"]
    names = {line.split("=", 1)[0] for line in own_env.splitlines() if "=" in line}
    assert f"MY_LISTED={listed}" in own_env.splitlines() and f"HOME={result['cwd']}" in own_env.splitlines()
    assert names <= {"PATH", "HOME", "LANG", "TERM", "TZ", "TMPDIR", "USER", "SHELL", "PWD", "SHLVL", "_"} | {
        "MY_LISTED"
    } | {n for n in names if n.startswith("LC_")}
    assert f"MY_LISTED={listed}" in parent_env  # the parent holds only the same allow-list
    if mode == "bwrap":
        assert "PATH=" in init_env  # the sandbox's init (bubblewrap) was started with the allow-list too


def test_local_environment_is_exactly_the_allow_list():
    host = {
        "PATH": "/x/bin",
        "LANG": "de_DE.UTF-8",
        "LC_ALL": "C",
        "TERM": "xterm",
        "USER": "u",
        "SHELL": "/bin/zsh",
    }
    host |= {"TZ": "UTC", "TMPDIR": "/var/tmp", "HOME": "/home/u", "OPENAI_API_KEY": "sk-x", "GH_TOKEN": "g"}
    settings = HermesSettings(sandbox_env=["GH_TOKEN", "MISSING"])
    assert local_environment("/p", settings, source=host) == {
        "PATH": "/x/bin", "LANG": "de_DE.UTF-8", "TERM": "xterm", "TZ": "UTC", "TMPDIR": "/var/tmp",
        "USER": "u", "SHELL": "/bin/zsh", "LC_ALL": "C", "GH_TOKEN": "g", "HOME": "/p",
    }  # fmt: skip
    assert local_environment("/p", HermesSettings(sandbox_env=[]), tmpdir="/tmp", source={}) == {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": "/tmp", "HOME": "/p",
    }  # fmt: skip


def test_bad_sandbox_env_names_are_a_clear_error():
    with pytest.raises(ValueError, match="HERMES_SANDBOX_ENV .* not valid: 'A-B'"):
        HermesSettings(sandbox_env="OK_NAME, A-B")
    assert HermesSettings(sandbox_env=" A , B_2 ,").sandbox_env == ["A", "B_2"]
