"""Small helpers shared by the tools that build shell commands for an environment."""

from __future__ import annotations

import re
import secrets
import shlex

from hermes_core.tools._registry import ToolContext

_ANSI_RE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: titles, hyperlinks
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
)


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colours, cursor control, OSC titles) from ``text``."""
    return _ANSI_RE.sub("", text)


def quote_path(path: str) -> str:
    """Shell-quote ``path`` for a POSIX shell, keeping a leading ``~`` / ``~/`` expanding to ``$HOME``.

    A path starting with ``-`` gets a ``./`` prefix so no command takes it for an option.

    Examples:
        >>> quote_path("~/a b")
        '"$HOME"/\\'a b\\''
        >>> quote_path("-x")
        './-x'
    """
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    if path.startswith("-"):
        path = "./" + path
    return shlex.quote(path)


def run_parts(ctx: ToolContext, snippets: list[str], timeout: float = 30) -> list[str]:
    """Run shell snippets as one command in ``ctx.env``; return each snippet's output.

    Outputs are split on a random separator line; one trailing newline of each is
    dropped. Missing parts (output cut by the environment's bound) come back as "".
    The timeout (seconds) is clamped by the prompt's deadline.

    Raises:
        PromptTimeout: the prompt's deadline has passed.
    """
    sep = f"__hermes_{secrets.token_hex(8)}__"
    script = f"; echo; echo {sep}; ".join(f"{{ {s}\n}}" for s in snippets)
    result = ctx.env.execute(script, timeout=ctx.bound_timeout(timeout))
    parts = result.output.split(f"\n{sep}\n")
    parts += [""] * (len(snippets) - len(parts))
    return [p.removesuffix("\n") for p in parts]
