"""Toolset ``file``: ``read_file``, ``write_file``, ``patch`` and ``search_files``.

Schemas and result shapes follow the Hermes agent's reference tools (README § Tools) (``read_file`` lines as ``N|text``
right-aligned to 6; ``patch`` with ``replace`` and V4A ``patch`` modes;
``search_files`` with ``target`` and ``output_mode``). Every access goes through
``ctx.env.read_file`` / ``write_file`` / ``execute``, so the tools work in any backend.
Paths may be absolute, relative to the environment's cwd, or ``~/...``.

``search_files`` uses ``rg`` when the environment has it, else ``find`` + ``grep -E``
(busybox-compatible options only). The choice is detected once per prompt and kept in
``ctx.state["file"]["search"]`` (``"rg"`` or ``"grep"``; a caller may preset it).
"""

from __future__ import annotations

import bisect
import difflib
import itertools
import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field

from hermes_core.exceptions import ToolError
from hermes_core.tools._registry import ToolContext, tool
from hermes_core.tools._shell import quote_path, run_parts

MAX_LINE_CHARS = 2000
"""read_file cuts longer lines, appending ``... [truncated]``."""
MAX_MATCH_CHARS = 500
"""search_files cuts the text of one match to this many characters."""
MAX_PATCH_BYTES = 10 * 1024 * 1024
"""patch refuses files larger than this."""
_BINARY_SNIFF = 8192
_IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".ico", ".tiff", ".tif"}
_SHELL_RC = {
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".cshrc",
    ".tcshrc",
}
_HOME_SECRETS = {
    ".netrc",
    ".git-credentials",
    ".pgpass",
    ".aws/credentials",
    ".docker/config.json",
    ".hermes/.env",
}
_SYSTEM_FILES = {"/etc/sudoers", "/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow"}
_NUMBERED_LINE = re.compile(r"^\s*\d+\|")


# -- helpers -----------------------------------------------------------------------


def _probe(ctx: ToolContext, path: str) -> tuple[str, int]:
    """Kind of ``path`` in the environment: ("file", size in bytes) / ("dir"|"other"|"missing", 0)."""
    p = quote_path(path)
    script = (
        f"if [ -f {p} ]; then echo file $(wc -c < {p}); elif [ -d {p} ]; then echo dir; "
        f"elif [ -e {p} ]; then echo other; else echo missing; fi"
    )
    result = ctx.env.execute(script, timeout=ctx.bound_timeout(30))
    words = result.output.split()
    if words[:1] == ["file"] and len(words) == 2 and words[1].isdigit():
        return "file", int(words[1])
    if words and words[0] in ("dir", "other", "missing"):
        return words[0], 0
    return "file", 0  # unreadable size: let read_file report the real error


def _kind_error(kind: str, path: str) -> ToolError:
    """The error for a path that is not a regular file (kind from :func:`_probe`)."""
    if kind == "missing":
        return ToolError(f"File not found: {path}")
    if kind == "dir":
        return ToolError(f"{path} is a directory, not a file")
    return ToolError(f"{path} is not a regular file (device, fifo or socket)")


def _read_bytes(ctx: ToolContext, path: str) -> bytes:
    """``ctx.env.read_file`` with OS errors turned into ToolError."""
    try:
        return ctx.env.read_file(path)
    except OSError as exc:
        raise _os_tool_error(path, exc, "read") from None


def _write_bytes(ctx: ToolContext, path: str, data: bytes) -> None:
    """``ctx.env.write_file`` with OS errors turned into ToolError."""
    try:
        ctx.env.write_file(path, data)
    except OSError as exc:
        raise _os_tool_error(path, exc, "write") from None


def _os_tool_error(path: str, exc: OSError, verb: str) -> ToolError:
    """The ToolError the model sees for ``exc`` from reading (``verb`` ``"read"``) or writing ``path``.

    A write keeps the system's wording (``Read-only file system``: what a command writing there sees).
    """
    if isinstance(exc, FileNotFoundError) and verb == "read":
        return ToolError(f"File not found: {path}")
    if isinstance(exc, IsADirectoryError):
        return ToolError(f"{path} is a directory, not a file")
    if isinstance(exc, PermissionError):
        return ToolError(f"Permission denied: {path}")
    reason = exc.strerror or str(exc)
    return ToolError(f"Could not {verb} {path}: {reason.lower() if verb == 'read' else reason}")


def _similar_files(ctx: ToolContext, path: str) -> list[str]:
    """Up to 5 names in the missing file's directory that look like its name."""
    parent, name = posixpath.split(path)
    result = ctx.env.execute(f"ls -1A {quote_path(parent or '.')} 2>/dev/null", timeout=ctx.bound_timeout(10))
    names = result.output.splitlines() if result.returncode == 0 else []
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    return [posixpath.join(parent, n) for n in close]


def _number(lines: list[str], first: int) -> str:
    """``N|text`` lines, N right-aligned to 6, lines over MAX_LINE_CHARS cut."""
    out = []
    for n, line in enumerate(lines, start=first):
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + "... [truncated]"
        out.append(f"{n:>6}|{line}")
    return "\n".join(out)


def _split_lines(text: str) -> list[str]:
    """Lines of ``text`` split on ``\\n`` (no empty last line for a final newline; ``\\r`` dropped)."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


# -- read_file ---------------------------------------------------------------------


@tool("file")
def read_file(
    ctx: ToolContext,
    path: str,
    offset: Annotated[int, Field(ge=1)] = 1,
    limit: Annotated[int, Field(ge=1, le=2000)] = 500,
) -> dict:
    """Read a text file with line numbers, a window of lines at a time.

    Each line comes as `N|text` (N right-aligned). Lines longer than 2000 characters are
    cut. When the file has more lines than shown, a hint gives the offset to continue.
    Binary files and images are refused.

    Args:
        path: file to read: absolute, relative to the working directory, or ~/...
        offset: first line to return (1-based).
        limit: maximum number of lines to return (at most 2000).
    """
    kind, size = _probe(ctx, path)
    if kind == "missing":
        reply: dict = {"error": f"File not found: {path}"}
        similar = _similar_files(ctx, path)
        if similar:
            reply["similar_files"] = similar
        return reply
    if kind != "file":
        raise _kind_error(kind, path)
    if posixpath.splitext(path)[1].lower() in _IMAGE_EXTENSIONS:
        return {
            "error": f"{path} is an image, not a text file; use vision_analyze to look at it",
            "is_image": True,
            "file_size": size,
        }
    if size > 4 * ctx.settings.tool_result_max_chars:
        lines, total, binary = _read_window(ctx, path, offset, limit, size)
    else:
        data = _read_bytes(ctx, path)
        size = len(data)
        binary = b"\x00" in data[:_BINARY_SNIFF]
        all_lines = [] if binary else _split_lines(data.decode("utf-8", errors="replace"))
        total = len(all_lines)
        lines = all_lines[offset - 1 : offset - 1 + limit]
    if binary:
        return {
            "error": f"Cannot read binary file: {path} ({size} bytes)",
            "is_binary": True,
            "file_size": size,
        }
    if total and offset > total:
        raise ToolError(f"offset {offset} is past the end of {path} ({total} lines)")
    content = _number(lines, offset)
    if len(json.dumps(content)) > ctx.settings.tool_result_max_chars - 500:
        return {
            "error": f"Lines {offset}-{offset + len(lines) - 1} of {path} are too large to return at once; "
            "read fewer lines with offset and limit",
            "total_lines": total,
        }
    end = offset + len(lines) - 1
    reply = {"content": content, "total_lines": total, "file_size": size, "truncated": end < total}
    if end < total:
        reply["hint"] = f"Use offset={end + 1} to continue reading (showing {offset}-{end} of {total} lines)"
    return reply


def _read_window(
    ctx: ToolContext, path: str, offset: int, limit: int, size: int
) -> tuple[list[str], int, bool]:
    """Lines offset..offset+limit-1 of a large file, read with shell tools: (lines, total_lines, binary)."""
    p = quote_path(path)
    newline_count, ends_with_newline, non_nul, window = run_parts(
        ctx,
        [
            f"wc -l < {p}",
            f"tail -c 1 {p} | wc -l",
            f"head -c {_BINARY_SNIFF} {p} | tr -d '\\000' | wc -c",
            f"sed -n '{offset},{offset + limit - 1}p' {p} | cut -c 1-{4 * MAX_LINE_CHARS + 4}",
        ],
        timeout=120,
    )
    if not non_nul.strip().isdigit() or int(non_nul) < min(size, _BINARY_SNIFF):
        return [], 0, True  # NUL bytes in the first 8 KB
    total = int(newline_count.strip() or 0) + (ends_with_newline.strip() == "0")
    if "... [OUTPUT TRUNCATED - " in window:  # cut by the environment's output bound
        raise ToolError(
            f"Lines {offset}-{offset + limit - 1} of {path} are too large to return at once; "
            "read fewer lines with offset and limit"
        )
    return _split_lines(window), total, False


# -- write_file --------------------------------------------------------------------


def _sensitive(path: str) -> bool:
    """True for paths no tool should write: ~/.ssh, shell rc files, credentials, /etc/sudoers ..."""
    norm = posixpath.normpath(path)
    parts = norm.split("/")
    if ".ssh" in parts or norm in _SYSTEM_FILES or norm.startswith("/etc/sudoers.d/"):
        return True
    home = re.match(r"^(~|/root|/home/[^/]+)/(.+)$", norm)
    return bool(home) and (home.group(2) in _SHELL_RC or home.group(2) in _HOME_SECRETS)


@tool("file")
def write_file(ctx: ToolContext, path: str, content: str) -> dict:
    """Create or overwrite a whole file with the given content; parent directories are created.

    Use patch for small edits of an existing file.

    Args:
        path: file to write: absolute, relative to the working directory, or ~/...
        content: the complete new content of the file.
    """
    if _sensitive(path):
        raise ToolError(
            f"Refusing to write to sensitive path {path} (credentials, ssh or shell startup file)"
        )
    lines = [line for line in content.splitlines() if line.strip()]
    if len(lines) >= 2 and all(_NUMBERED_LINE.match(line) for line in lines):
        raise ToolError(
            "content looks like read_file output with `N|` line numbers; write the plain text instead"
        )
    parent = posixpath.dirname(path)
    dirs_created = False
    if parent and parent not in (".", "/", "~"):
        check = ctx.env.execute(f"test -d {quote_path(parent)}", timeout=ctx.bound_timeout(30))
        dirs_created = check.returncode != 0
    data = content.encode("utf-8")
    _write_bytes(ctx, path, data)
    return {"bytes_written": len(data), "dirs_created": dirs_created}


# -- patch -------------------------------------------------------------------------


@dataclass
class _Text:
    """A text file's content with ``\\n`` line ends, remembering whether it used ``\\r\\n``."""

    text: str
    crlf: bool = False

    @classmethod
    def load(cls, ctx: ToolContext, path: str, missing_ok: bool = False) -> _Text | None:
        """Read ``path`` as UTF-8 text; None when it is missing and ``missing_ok``.

        Raises:
            ToolError: missing (unless ``missing_ok``), not a regular file, too large,
                binary or not UTF-8.
        """
        kind, size = _probe(ctx, path)
        if kind == "missing" and missing_ok:
            return None
        if kind != "file":
            raise _kind_error(kind, path)
        if size > MAX_PATCH_BYTES:
            raise ToolError(f"{path} is too large to patch ({size} bytes); use terminal tools")
        data = _read_bytes(ctx, path)
        if b"\x00" in data[:_BINARY_SNIFF]:
            raise ToolError(f"Cannot patch binary file: {path}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"Cannot patch {path}: it is not valid UTF-8 text") from None
        crlf = "\r\n" in text
        return cls(text.replace("\r\n", "\n") if crlf else text, crlf)

    def dump(self, text: str) -> bytes:
        return (text.replace("\n", "\r\n") if self.crlf else text).encode("utf-8")


MAX_HUNKS = 5000
"""patch refuses an ``Update File`` section with more ``@@`` hunks than this."""
MAX_DIFF_LINES = 2000
"""A changed region with more lines than this (either side) is shown whole, not diffed (linear)."""
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def _diff_budget(ctx: ToolContext) -> int:
    """Characters the diffs of one patch result may take: half the tool result bound, so that a
    large diff never turns a patch that was made into a "result too large" error."""
    return ctx.settings.tool_result_max_chars // 2


def unified_diff(path: str, before: str, after: str, max_chars: int) -> str:
    """Unified diff of one file with ``a/`` and ``b/`` names ("" when unchanged), 3 lines of context.

    Host work is linear in the size of both texts: the lines both share at the start and at
    the end are set aside first, :mod:`difflib` compares only the changed region between, and a
    region longer than :data:`MAX_DIFF_LINES` is shown as removed then added (still a valid
    diff, not a minimal one). The text is cut before it passes ``max_chars`` characters, with a
    ``\\ diff cut: N more lines`` note (the edit itself is always made whole).
    """
    name = path.lstrip("/")
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    first = max(0, head - 3)  # difflib's context comes from inside the slices
    a_mid, b_mid = a[first : len(a) - max(0, tail - 3)], b[first : len(b) - max(0, tail - 3)]
    if a_mid == b_mid:
        return ""
    if max(len(a_mid), len(b_mid)) <= MAX_DIFF_LINES:
        body = list(difflib.unified_diff(a_mid, b_mid, f"a/{name}", f"b/{name}"))
    else:
        before_context, after_context = a[first:head], a[len(a) - tail : len(a) - max(0, tail - 3)]
        removed, added = a[head : len(a) - tail], b[head : len(b) - tail]
        old_count = len(before_context) + len(removed) + len(after_context)
        new_count = len(before_context) + len(added) + len(after_context)
        ranges = f"-{min(1, old_count)},{old_count} +{min(1, new_count)},{new_count}"  # difflib's form
        body = [f"--- a/{name}\n", f"+++ b/{name}\n", f"@@ {ranges} @@\n"]
        body += [" " + line for line in before_context]
        body += ["-" + line for line in removed] + ["+" + line for line in added]
        body += [" " + line for line in after_context]
    out, size = [], 0
    for number, line in enumerate(body):
        if m := _HUNK_HEADER.match(line):  # slice line numbers back to file line numbers
            old_at, new_at = int(m[1]) + first, int(m[3]) + first
            line = f"@@ -{old_at}{m[2] or ''} +{new_at}{m[4] or ''} @@" + line[m.end() :]
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        if size + len(line) > max_chars - 48:  # room for the note
            out.append(f"\\ diff cut: {len(body) - number} more lines\n")
            break
        out.append(line)
        size += len(line)
    return "".join(out)


@tool("file")
def patch(
    ctx: ToolContext,
    mode: Literal["replace", "patch"] = "replace",
    path: str | None = None,
    old_string: str | None = None,
    new_string: str | None = None,
    replace_all: bool = False,
    patch: str | None = None,
) -> dict:
    """Edit files: replace an exact string in one file, or apply a multi-file V4A patch.

    replace mode: old_string must occur exactly once in the file (include surrounding lines
    to make it unique) unless replace_all is true. patch mode: a V4A patch between
    `*** Begin Patch` and `*** End Patch`, with `*** Update File: <path>` (hunks starting with
    `@@`, lines prefixed by space for context, - to remove, + to add), `*** Add File: <path>`
    (every line prefixed by +) and `*** Delete File: <path>` sections.

    Args:
        mode: replace (exact string replacement in one file) or patch (V4A patch text).
        path: replace mode: the file to edit.
        old_string: replace mode: the exact text to find.
        new_string: replace mode: the replacement text ("" deletes old_string).
        replace_all: replace mode: replace every occurrence instead of requiring exactly one.
        patch: patch mode: the V4A patch text.
    """
    if mode == "patch":
        if not patch:
            raise ToolError("patch is required for mode=patch")
        return _apply_v4a(ctx, patch)
    for name, value in (("path", path), ("old_string", old_string), ("new_string", new_string)):
        if value is None:
            raise ToolError(f"{name} is required for mode=replace")
    if old_string == "":
        raise ToolError("old_string must not be empty")
    if old_string == new_string:
        raise ToolError("old_string and new_string are identical; nothing to change")
    file = _Text.load(ctx, path)
    if file.crlf:
        old_string, new_string = old_string.replace("\r\n", "\n"), new_string.replace("\r\n", "\n")
    count = file.text.count(old_string)
    if count == 0:
        raise ToolError(f"Could not find a match for old_string in {path}")
    if count > 1 and not replace_all:
        starts, at = [], -1
        while len(starts) < 5 and (at := file.text.find(old_string, at + 1)) != -1:
            starts.append(file.text.count("\n", 0, at) + 1)
        raise ToolError(
            f"Found {count} matches for old_string in {path} (lines {', '.join(map(str, starts))}); "
            "include more surrounding context to make it unique, or set replace_all=true"
        )
    after = file.text.replace(old_string, new_string, -1 if replace_all else 1)
    _write_bytes(ctx, path, file.dump(after))
    diff = unified_diff(path, file.text, after, _diff_budget(ctx))
    return {"success": True, "diff": diff, "files_modified": [path]}


@dataclass
class _FileOp:
    """One ``*** <kind> File: <path>`` section of a V4A patch and its body lines."""

    kind: Literal["add", "update", "delete"]
    path: str
    body: list[str] = field(default_factory=list)


_HEADERS = {"*** Add File:": "add", "*** Update File:": "update", "*** Delete File:": "delete"}


def _parse_v4a(text: str) -> list[_FileOp]:
    """Split V4A patch text into file operations.

    Raises:
        ToolError: missing ``*** Begin Patch``, unknown ``***`` header, text outside a
            section, empty or ``..`` paths, or no operations.
    """
    lines = [line.removesuffix("\r") for line in text.strip("\n").split("\n")]
    if not lines or lines[0].strip() != "*** Begin Patch":
        raise ToolError("patch must start with '*** Begin Patch'")
    ops: list[_FileOp] = []
    for line in lines[1:]:
        if line.strip() == "*** End Patch":
            break
        header = next((h for h in _HEADERS if line.startswith(h)), None)
        if header:
            path = line[len(header) :].strip()
            if not path or ".." in path.split("/"):
                raise ToolError(f"Invalid path in patch header: {line!r} ('..' is not allowed)")
            ops.append(_FileOp(_HEADERS[header], path))
        elif line.strip() == "*** End of File":
            continue
        elif line.startswith("*** "):
            raise ToolError(f"Unsupported patch header: {line!r}")
        elif ops:
            ops[-1].body.append(line)
        elif line.strip():
            raise ToolError(f"Patch line outside a file section: {line!r}")
    if not ops:
        raise ToolError("patch contains no '*** Add/Update/Delete File:' section")
    return ops


class _LineIndex:
    """``lines`` (no ``\\n`` in any) as one text with line offsets, for linear searches over lines.

    ``text`` is ``"\\n" + "\\n".join(lines) + "\\n"``; ``starts[i]`` is the index in ``text`` of
    the newline just before line ``i`` (``starts[len(lines)]`` is the final one). Built in O(total
    characters); each search is one ``str.find`` (C speed) and a bisect.
    """

    def __init__(self, lines: list[str]) -> None:
        self.text = "\n" + "\n".join(lines) + "\n"
        self.starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))

    def block(self, block: list[str], start: int) -> int:
        """Index of the first line ``i >= start`` where ``block`` (non-empty) begins; -1 when absent."""
        if start >= len(self.starts):
            return -1
        at = self.text.find("\n" + "\n".join(block) + "\n", self.starts[start])
        return -1 if at < 0 else bisect.bisect_left(self.starts, at)

    def line_containing(self, needle: str, start: int) -> int | None:
        """Index of the first line ``i >= start`` that contains ``needle`` (no newline in it); None when none."""
        if start >= len(self.starts) - 1:
            return None
        at = self.text.find(needle, self.starts[start] + 1)
        return None if at < 0 else bisect.bisect_right(self.starts, at) - 1


_NORMS = (None, str.rstrip, str.strip)
"""How hunk lines are compared, in order: exactly, ignoring trailing, then surrounding whitespace."""


def find_block(indexes: dict, lines: list[str], block: list[str], start: int) -> int:
    """Index of ``block`` (non-empty) in ``lines`` at or after ``start``, else anywhere; -1 when absent.

    Tried exactly, then ignoring trailing whitespace, then ignoring surrounding whitespace; the
    first of these that finds the block wins. ``indexes`` caches one :class:`_LineIndex` of
    ``lines`` per comparison (built on first need), so the hunks of one file cost one pass over
    it each, plus a ``str.find`` per hunk.
    """
    for norm in _NORMS:
        if norm not in indexes:
            indexes[norm] = _LineIndex(lines if norm is None else [norm(line) for line in lines])
        wanted = block if norm is None else [norm(line) for line in block]
        for begin in (start, 0):
            at = indexes[norm].block(wanted, begin)
            if at >= 0:
                return at
    return -1


def apply_hunks(path: str, text: str, body: list[str]) -> str:
    """Apply the ``@@`` hunks of one ``Update File`` section to ``text``.

    As in OpenAI's reference ``apply_patch``, every hunk is found in the original text, each
    after the previous one (or, failing that, anywhere), and the edits are made at the end; so
    a hunk's context lines are lines of the file as it was. Linear in the file's size plus the
    patch's (one :class:`_LineIndex` per line comparison tried), at most :data:`MAX_HUNKS` hunks.

    Raises:
        ToolError: an invalid hunk line, a hunk whose context is not in the file, two hunks
            on the same lines, or more than :data:`MAX_HUNKS` hunks.
    """
    hunks: list[tuple[str, list[tuple[str, str]]]] = []
    for line in body:
        if line.startswith("@@"):
            hunks.append((line.strip("@ \t"), []))
            continue
        if not hunks:
            hunks.append(("", []))
        tag, rest = (line[:1] or " "), line[1:]
        if tag not in " -+":
            raise ToolError(f"Invalid line in hunk for {path} (must start with ' ', '-' or '+'): {line!r}")
        hunks[-1][1].append((tag, rest))
    if len(hunks) > MAX_HUNKS:
        raise ToolError(f"Too many hunks for {path} ({len(hunks)}, at most {MAX_HUNKS}); split the patch")
    ends_with_newline = text.endswith("\n") or not text
    lines = _split_lines(text)
    indexes: dict = {}
    edits: list[tuple[int, int, list[str], int]] = []  # (first line, lines replaced, new lines, hunk)
    cursor = 0
    for number, (hint, changes) in enumerate(hunks, start=1):
        old = [t for tag, t in changes if tag != "+"]
        new = [t for tag, t in changes if tag != "-"]
        if not changes:
            continue
        start = cursor
        if hint.strip():
            if None not in indexes:
                indexes[None] = _LineIndex(lines)
            anchor = indexes[None].line_containing(hint.strip(), cursor)
            if anchor is not None:
                start = anchor
        if not old:
            at = start + 1 if hint and start < len(lines) and hint.strip() in lines[start] else len(lines)
        else:
            at = find_block(indexes, lines, old, start)
            if at < 0:
                shown = "\n".join(old[:5])
                raise ToolError(
                    f"Could not apply hunk {number} to {path}: these lines were not found:\n{shown}"
                )
        edits.append((at, len(old), new, number))
        cursor = at + len(old)
    edits.sort(key=lambda edit: edit[0])  # stable: insertions at one place keep the patch's order
    out: list[str] = []
    done = 0
    for at, length, new, number in edits:
        if at < done:
            raise ToolError(f"Could not apply hunk {number} to {path}: it overlaps the lines of another hunk")
        out += lines[done:at]
        out += new
        done = at + length
    out += lines[done:]
    return "\n".join(out) + ("\n" if ends_with_newline and out else "")


def _apply_v4a(ctx: ToolContext, patch_text: str) -> dict:
    """Validate and compute every file of the patch, then write them; returns the patch result."""
    ops = _parse_v4a(patch_text)
    before: dict[str, _Text | None] = {}  # path -> original (None: did not exist)
    after: dict[str, str | None] = {}  # path -> new text (None: deleted)
    for op in ops:
        if op.path not in before:
            before[op.path] = _Text.load(ctx, op.path, missing_ok=True)
            after[op.path] = before[op.path].text if before[op.path] else None
        current = after[op.path]
        if op.kind == "add":
            if current is not None:
                raise ToolError(f"Cannot add {op.path}: the file already exists (use *** Update File)")
            bad = next((line for line in op.body if line and not line.startswith("+")), None)
            if bad is not None:
                raise ToolError(f"Every line of an added file must start with '+': {bad!r}")
            after[op.path] = "".join(line[1:] + "\n" for line in op.body)
        elif current is None:
            raise ToolError(f"Cannot {op.kind} {op.path}: file not found")
        elif op.kind == "delete":
            after[op.path] = None
        else:
            after[op.path] = apply_hunks(op.path, current, op.body)
    modified, created, deleted, diffs = [], [], [], []
    for path, new in after.items():
        old = before[path]
        if new is None and old is None:
            continue
        if new is None:
            result = ctx.env.execute(f"rm -f {quote_path(path)}", timeout=ctx.bound_timeout(30))
            if result.returncode != 0:
                raise ToolError(f"Could not delete {path}: {result.output.strip()[:300]}")
            deleted.append(path)
        else:
            _write_bytes(ctx, path, old.dump(new) if old else new.encode("utf-8"))
            (modified if old else created).append(path)
        budget = _diff_budget(ctx) - sum(map(len, diffs))
        diffs.append(unified_diff(path, old.text if old else "", new or "", max(budget, 0)))
    return {
        "success": True,
        "diff": "".join(diffs),
        "files_modified": modified,
        "files_created": created,
        "files_deleted": deleted,
    }


# -- search_files ------------------------------------------------------------------

_TOTAL = "__hermes_total__"
_MISSING = "__hermes_missing__"
_BAD_REGEX = "__hermes_bad_regex__"
_MATCH_RE = re.compile(r"^(.*?):(\d+):(.*)$")
_ANY_RE = re.compile(r"^(.*?)[:-](\d+)[:-](.*)$")


def _search_engine(ctx: ToolContext) -> str:
    """ "rg" when the environment has ripgrep, else "grep"; detected once per prompt."""
    state = ctx.state.setdefault("file", {})
    if "search" not in state:
        found = ctx.env.execute("command -v rg >/dev/null 2>&1", timeout=ctx.bound_timeout(30))
        state["search"] = "rg" if found.returncode == 0 else "grep"
    return state["search"]


def _name_test(glob: str) -> str:
    """``find`` test matching a file-name glob (``**/`` prefixes dropped; globs with ``/`` match the path)."""
    while glob.startswith("**/"):
        glob = glob[3:]
    return f"-path {shlex.quote('*/' + glob)}" if "/" in glob else f"-name {shlex.quote(glob)}"


def _page_awk(offset: int, limit: int, mode: str) -> str:
    """awk program printing the [offset, offset+limit) window of its input, then ``_TOTAL n [sum]``."""
    window = f"n > {offset} && n <= {offset + limit}"
    if mode == "count":  # "path:count" lines; files without matches skipped, counts summed
        body = f'{{ c = $0; sub(/.*:/, "", c); if (c + 0 == 0) next; n++; s += c; if ({window}) print }}'
        return f'awk \'{body} END {{ print "{_TOTAL} " n + 0 " " s + 0 }}\''
    sep = (
        f'$0 == "--" {{ if (n > {offset} && n < {offset + limit}) print; next }} '
        if mode == "context"
        else ""
    )
    body = f"{sep}{{ n++; if ({window}) print substr($0, 1, {MAX_MATCH_CHARS + 1000}) }}"
    return f"awk '{body} END {{ print \"{_TOTAL} \" n + 0 }}'"


def _search_command(
    engine: str, pattern: str, target: str, path: str, file_glob: str | None, output_mode: str, context: int
) -> str:
    """The shell pipeline listing every result line (before paging)."""
    p, pat = quote_path(path), shlex.quote(pattern)
    if target == "files":
        if engine == "rg":
            return f"rg --files --sortr modified -g {pat} {p} 2>/dev/null"
        return (
            f"find {p} -type f ! -path '*/.git/*' {_name_test(pattern)} -exec stat -c '%Y %n' {{}} + 2>/dev/null"
            " | sort -rn | sed 's/^[0-9]* //'"
        )
    if engine == "rg":
        flag = {"files_only": "-l", "count": "-c"}.get(output_mode, f"-n -C {context}" if context else "-n")
        glob = f"-g {shlex.quote(file_glob)} " if file_glob else ""
        return (
            f"rg --no-heading --with-filename --color never --sort path {flag} {glob}-e {pat} {p} 2>/dev/null"
        )
    flag = {"files_only": "-l", "count": "-cH"}.get(output_mode, f"-nH -C {context}" if context else "-nH")
    glob = f"{_name_test(file_glob)} " if file_glob else ""
    return f"find {p} -type f ! -path '*/.git/*' {glob}-exec grep -E {flag} -e {pat} {{}} + 2>/dev/null"


def _parse_matches(lines: list[str], context: int) -> list[dict]:
    """``path:line:text`` (and, with context, ``path-line-text``) lines -> match dicts."""
    matches = []
    groups: list[list[str]] = [[]]
    for line in lines:
        if line == "--":
            groups.append([])
        else:
            groups[-1].append(line)
    for group in groups:
        # A group belongs to one file; its match lines name it, so context lines can be split exactly.
        paths = sorted({m.group(1) for line in group if (m := _MATCH_RE.match(line))}, key=len, reverse=True)
        for line in group:
            found = None
            for path in paths if context else ():
                for sep in ":-":
                    if line.startswith(path + sep):
                        num, s, text = line[len(path) + 1 :].partition(sep)
                        if s and num.isdigit():
                            found = (path, num, text)
                            break
                if found:
                    break
            if found is None:
                m = (_ANY_RE if context else _MATCH_RE).match(line)
                if not m:
                    continue
                found = m.groups()
            path, num, text = found
            matches.append({"path": path, "line": int(num), "content": text[:MAX_MATCH_CHARS]})
    return matches


@tool("file")
def search_files(
    ctx: ToolContext,
    pattern: str,
    target: Literal["content", "files"] = "content",
    path: str = ".",
    file_glob: str | None = None,
    limit: Annotated[int, Field(ge=1)] = 50,
    offset: Annotated[int, Field(ge=0)] = 0,
    output_mode: Literal["content", "files_only", "count"] = "content",
    context: Annotated[int, Field(ge=0)] = 0,
) -> dict:
    """Search file contents with a regular expression, or find files by name with a glob.

    target=content searches inside files (extended regex); output_mode chooses matching lines,
    only the file paths, or per-file match counts. target=files lists files whose names
    match the glob pattern, newest first. Results are paged with limit and offset.

    Args:
        pattern: regular expression (target=content) or file-name glob such as *.py (target=files).
        target: content to search inside files, files to search file names.
        path: directory or file to search in.
        file_glob: target=content: only search files whose names match this glob (e.g. *.py).
        limit: maximum number of results to return.
        offset: number of results to skip (pagination).
        output_mode: target=content: content (matching lines), files_only (paths) or count (matches per file).
        context: target=content, output_mode=content: lines of context before and after each match.
    """
    engine = _search_engine(ctx)
    mode = "files" if target == "files" else output_mode
    if mode == "content" and context:
        mode = "context"
    p = quote_path(path)
    check = ""
    if target == "content":
        probe = (
            f"rg -q -e {shlex.quote(pattern)} /dev/null"
            if engine == "rg"
            else f"grep -E -e {shlex.quote(pattern)}"
        )
        check = (
            f"err=$(printf '' | {probe} 2>&1 >/dev/null); "
            f'if [ $? -eq 2 ]; then echo {_BAD_REGEX}; echo "$err"; exit 0; fi; '
        )
    script = (
        f"if [ ! -e {p} ]; then echo {_MISSING}; exit 0; fi; {check}"
        f"{_search_command(engine, pattern, target, path, file_glob, output_mode, context)}"
        f" | {_page_awk(offset, limit, mode)}"
    )
    result = ctx.env.execute(script, timeout=ctx.bound_timeout(ctx.settings.terminal_timeout))
    if result.timed_out:
        raise ToolError("search timed out; narrow the path or the pattern")
    out = result.output
    if out.startswith(_MISSING):
        raise ToolError(f"Path not found: {path}")
    if out.startswith(_BAD_REGEX):
        raise ToolError(f"Invalid regular expression {pattern!r}: {out[len(_BAD_REGEX) :].strip()[:300]}")
    lines = out.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    totals = lines.pop().split() if lines and lines[-1].startswith(_TOTAL) else []
    found = int(totals[1]) if len(totals) > 1 else 0
    truncated = offset + limit < found or result.truncated
    reply: dict = {"total_count": found}
    if mode == "count":
        reply["total_count"] = int(totals[2]) if len(totals) > 2 else 0
        counts = {}
        for line in lines:
            name, _, n = line.rpartition(":")
            if name and n.isdigit():
                counts[name] = int(n)
        reply["counts"] = counts
    elif mode in ("files", "files_only"):
        reply["files"] = lines
    else:
        reply["matches"] = _parse_matches(lines, context)
    reply["truncated"] = truncated
    if truncated:
        reply["hint"] = f"Results truncated. Use offset={offset + limit} to see more."
    return reply


__all__ = [
    "MAX_DIFF_LINES",
    "MAX_HUNKS",
    "MAX_LINE_CHARS",
    "MAX_MATCH_CHARS",
    "MAX_PATCH_BYTES",
    "apply_hunks",
    "find_block",
    "patch",
    "read_file",
    "search_files",
    "unified_diff",
    "write_file",
]
