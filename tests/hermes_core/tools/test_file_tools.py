"""Toolset file (read_file, write_file, patch, search_files) through the registry on a real LocalEnvironment."""

from __future__ import annotations

import json
import shutil

import pytest

from hermes_core.environments.local import LocalEnvironment
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, TOOLSETS, ToolContext


def make_ctx(env: LocalEnvironment, **settings) -> ToolContext:
    return ToolContext(env=env, settings=HermesSettings(**settings))


@pytest.fixture
def ctx(env):
    context = make_ctx(env)
    yield context
    context.close()


def call(ctx: ToolContext, name: str, **arguments) -> dict:
    return json.loads(REGISTRY[name].invoke(ctx, arguments))


def test_toolset_and_schemas():
    assert TOOLSETS["file"] == ("read_file", "write_file", "patch", "search_files")
    read = REGISTRY["read_file"].schema()["function"]["parameters"]
    assert read["required"] == ["path"]
    assert (read["properties"]["offset"]["minimum"], read["properties"]["limit"]["maximum"]) == (1, 2000)
    assert REGISTRY["write_file"].schema()["function"]["parameters"]["required"] == ["path", "content"]
    patch = REGISTRY["patch"].schema()["function"]["parameters"]
    assert patch["properties"]["mode"]["enum"] == ["replace", "patch"]
    assert list(patch["properties"]) == ["mode", "path", "old_string", "new_string", "replace_all", "patch"]
    search = REGISTRY["search_files"].schema()["function"]["parameters"]
    assert search["required"] == ["pattern"]
    assert search["properties"]["output_mode"]["enum"] == ["content", "files_only", "count"]


# -- read_file ---------------------------------------------------------------------


def test_read_file_format(ctx, env):
    env.write_file("m.py", b"import os\nx = 1\n")
    assert call(ctx, "read_file", path="m.py") == {
        "content": "     1|import os\n     2|x = 1",
        "total_lines": 2,
        "file_size": 16,
        "truncated": False,
    }
    env.write_file("crlf.txt", b"a\r\nb")  # CR dropped, last line without newline counted
    assert call(ctx, "read_file", path="crlf.txt")["content"] == "     1|a\n     2|b"
    env.write_file("empty.txt", b"")
    assert call(ctx, "read_file", path="empty.txt") == {
        "content": "",
        "total_lines": 0,
        "file_size": 0,
        "truncated": False,
    }


def test_read_file_offset_limit_hint(ctx, env):
    env.write_file("ten.txt", "".join(f"line {i}\n" for i in range(1, 11)).encode())
    result = call(ctx, "read_file", path="ten.txt", offset=3, limit=4)
    assert result["content"] == "     3|line 3\n     4|line 4\n     5|line 5\n     6|line 6"
    assert result["truncated"] is True and result["total_lines"] == 10
    assert result["hint"] == "Use offset=7 to continue reading (showing 3-6 of 10 lines)"
    last = call(ctx, "read_file", path="ten.txt", offset=7, limit=4)
    assert last["content"].splitlines()[-1] == "    10|line 10" and "hint" not in last
    assert "past the end" in call(ctx, "read_file", path="ten.txt", offset=11)["error"]
    assert call(ctx, "read_file", path="ten.txt", limit=2001)["error"].startswith("Invalid arguments")


def test_read_file_cuts_long_lines(ctx, env):
    env.write_file("long.txt", b"a" * 2500 + b"\nshort\n")
    result = call(ctx, "read_file", path="long.txt")
    assert result["content"] == "     1|" + "a" * 2000 + "... [truncated]\n     2|short"


def test_read_file_missing_binary_directory_device(ctx, env):
    env.write_file("src/config.yaml", b"a: 1\n")
    assert call(ctx, "read_file", path="nope.txt") == {"error": "File not found: nope.txt"}
    assert call(ctx, "read_file", path="src/config.yml") == {
        "error": "File not found: src/config.yml",
        "similar_files": ["src/config.yaml"],
    }
    env.write_file("blob.bin", b"\x7fELF\x00\x01\x02")
    binary = call(ctx, "read_file", path="blob.bin")
    assert binary["is_binary"] is True and "binary" in binary["error"]
    assert "directory" in call(ctx, "read_file", path="src")["error"]
    assert "not a regular file" in call(ctx, "read_file", path="/dev/zero")["error"]
    env.write_file("pic.png", b"\x89PNG\r\n")
    assert call(ctx, "read_file", path="pic.png")["is_image"] is True


def test_read_file_too_large_result_is_an_error(env):
    ctx = make_ctx(env, tool_result_max_chars=1000)
    env.write_file("wide.txt", ("x" * 100 + "\n").encode() * 20)
    result = call(ctx, "read_file", path="wide.txt")
    assert list(result) == ["error", "total_lines"] and result["total_lines"] == 20
    assert call(ctx, "read_file", path="wide.txt", limit=3)["total_lines"] == 20


def test_read_file_large_file_is_read_by_window(env):
    ctx = make_ctx(env, tool_result_max_chars=1000)  # files over 4000 bytes take the shell path
    env.write_file("big.txt", "".join(f"row {i}\n" for i in range(1, 1001)).encode() + b"tail")
    result = call(ctx, "read_file", path="big.txt", offset=500, limit=3)
    assert result == {
        "content": "   500|row 500\n   501|row 501\n   502|row 502",
        "total_lines": 1001,
        "file_size": len(env.read_file("big.txt")),
        "truncated": True,
        "hint": "Use offset=503 to continue reading (showing 500-502 of 1001 lines)",
    }
    assert call(ctx, "read_file", path="big.txt", offset=1001)["content"] == "  1001|tail"
    env.write_file("big.bin", b"\x00" * 9000)
    assert call(ctx, "read_file", path="big.bin")["is_binary"] is True


# -- write_file --------------------------------------------------------------------


def test_write_file_creates_parents(ctx, env):
    assert call(ctx, "write_file", path="a/b/c.txt", content="héllo\n") == {
        "bytes_written": 7,
        "dirs_created": True,
    }
    assert env.read_file("a/b/c.txt") == "héllo\n".encode()
    assert call(ctx, "write_file", path="a/b/d.txt", content="x") == {
        "bytes_written": 1,
        "dirs_created": False,
    }
    assert call(ctx, "write_file", path="top.txt", content="") == {"bytes_written": 0, "dirs_created": False}


def test_write_file_refuses_sensitive_paths_and_numbered_content(ctx):
    for path in (
        "~/.ssh/authorized_keys",
        "/root/.ssh/id_rsa",
        "/etc/sudoers",
        "~/.bashrc",
        "/home/u/.zshrc",
    ):
        assert "sensitive" in call(ctx, "write_file", path=path, content="x")["error"], path
    pasted = "     1|import os\n     2|x = 1\n"
    assert "line numbers" in call(ctx, "write_file", path="p.py", content=pasted)["error"]


# -- patch: replace mode -----------------------------------------------------------


def test_patch_replace_success(ctx, env):
    env.write_file("f.py", b"def f():\n    return 1\n")
    result = call(ctx, "patch", path="f.py", old_string="return 1", new_string="return 2")
    assert result == {
        "success": True,
        "diff": "--- a/f.py\n+++ b/f.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n",
        "files_modified": ["f.py"],
    }
    assert env.read_file("f.py") == b"def f():\n    return 2\n"


def test_patch_replace_missing_and_ambiguous(ctx, env):
    env.write_file("g.txt", b"x = 1\ny = 2\nx = 1\n")
    assert call(ctx, "patch", path="g.txt", old_string="z = 9", new_string="") == {
        "error": "Could not find a match for old_string in g.txt"
    }
    ambiguous = call(ctx, "patch", path="g.txt", old_string="x = 1", new_string="x = 5")
    assert ambiguous["error"].startswith("Found 2 matches for old_string in g.txt (lines 1, 3)")
    assert env.read_file("g.txt") == b"x = 1\ny = 2\nx = 1\n"
    assert call(ctx, "patch", path="nope.txt", old_string="a", new_string="b") == {
        "error": "File not found: nope.txt"
    }
    assert "required" in call(ctx, "patch", path="g.txt", old_string="x")["error"]


def test_patch_replace_all_and_crlf(ctx, env):
    env.write_file("g.txt", b"x = 1\ny = 2\nx = 1\n")
    result = call(ctx, "patch", path="g.txt", old_string="x = 1", new_string="x = 5", replace_all=True)
    assert result["success"] is True and result["diff"].count("+x = 5") == 2
    assert env.read_file("g.txt") == b"x = 5\ny = 2\nx = 5\n"
    env.write_file("w.txt", b"a\r\nb\r\n")
    call(ctx, "patch", path="w.txt", old_string="a\nb", new_string="a\nc")
    assert env.read_file("w.txt") == b"a\r\nc\r\n"


# -- patch: V4A mode ---------------------------------------------------------------


def test_v4a_update_add_delete(ctx, env):
    env.write_file("app/main.py", b"import os\n\ndef main():\n    print('hi')\n    return 0\n")
    env.write_file("old.txt", b"bye\n")
    text = """*** Begin Patch
*** Update File: app/main.py
@@ def main():
     print('hi')
-    return 0
+    return 1
*** Add File: app/util.py
+def helper():
+    return 42
*** Delete File: old.txt
*** End Patch"""
    result = call(ctx, "patch", mode="patch", patch=text)
    assert result["success"] is True
    assert result["files_modified"] == ["app/main.py"]
    assert result["files_created"] == ["app/util.py"]
    assert result["files_deleted"] == ["old.txt"]
    assert "--- a/app/main.py\n+++ b/app/main.py\n" in result["diff"]
    assert "-    return 0\n+    return 1\n" in result["diff"]
    assert "+++ b/app/util.py\n@@ -0,0 +1,2 @@\n+def helper():\n+    return 42\n" in result["diff"]
    assert "--- a/old.txt\n+++ b/old.txt\n@@ -1 +0,0 @@\n-bye\n" in result["diff"]
    assert env.read_file("app/main.py") == b"import os\n\ndef main():\n    print('hi')\n    return 1\n"
    assert env.read_file("app/util.py") == b"def helper():\n    return 42\n"
    with pytest.raises(FileNotFoundError):
        env.read_file("old.txt")


def test_v4a_errors_change_nothing(ctx, env):
    env.write_file("a.txt", b"one\ntwo\n")
    bad_context = (
        "*** Begin Patch\n*** Add File: new.txt\n+n\n*** Update File: a.txt\n@@\n-three\n+3\n*** End Patch"
    )
    assert "Could not apply hunk 1 to a.txt" in call(ctx, "patch", mode="patch", patch=bad_context)["error"]
    with pytest.raises(FileNotFoundError):
        env.read_file("new.txt")  # nothing written when one section fails
    escape = "*** Begin Patch\n*** Add File: ../evil.txt\n+x\n*** End Patch"
    assert "'..' is not allowed" in call(ctx, "patch", mode="patch", patch=escape)["error"]
    assert "Begin Patch" in call(ctx, "patch", mode="patch", patch="*** Update File: a.txt\n")["error"]
    exists = "*** Begin Patch\n*** Add File: a.txt\n+x\n*** End Patch"
    assert "already exists" in call(ctx, "patch", mode="patch", patch=exists)["error"]
    missing = "*** Begin Patch\n*** Delete File: gone.txt\n*** End Patch"
    assert "file not found" in call(ctx, "patch", mode="patch", patch=missing)["error"]
    assert call(ctx, "patch", mode="patch")["error"] == "patch is required for mode=patch"
    assert env.read_file("a.txt") == b"one\ntwo\n"


def test_v4a_hunks_are_found_in_the_original_file_in_order(ctx, env):
    # 200,000 equal lines and a block that differs only in its last line: found (or not) by one
    # pass over the file, where a line-by-line comparison of every window took about 26 s
    env.write_file("big.txt", ("x\n" * 200_000 + "y\n").encode())
    block = "".join(" x\n" for _ in range(999)) + "-y\n+Y\n"
    result = call(
        ctx,
        "patch",
        mode="patch",
        patch=f"*** Begin Patch\n*** Update File: big.txt\n@@\n{block}*** End Patch",
    )
    assert result["success"] is True
    assert env.read_file("big.txt") == ("x\n" * 200_000 + "Y\n").encode()
    absent = "*** Begin Patch\n*** Update File: big.txt\n@@\n" + " x\n" * 999 + "-z\n*** End Patch"
    assert "Could not apply hunk 1 to big.txt" in call(ctx, "patch", mode="patch", patch=absent)["error"]
    # context lines are the file as it was: hunk 2 cannot match what hunk 1 added; whitespace
    # differences are tolerated (trailing, then surrounding); a hint moves the search forward
    env.write_file("h.txt", b"a\nb\nc\n  d  \nb\n")
    hunks = "@@\n-a\n+c\n@@ d\n-b\n+B\n@@\n c\n-d\n+D\n"
    result = call(
        ctx, "patch", mode="patch", patch=f"*** Begin Patch\n*** Update File: h.txt\n{hunks}*** End Patch"
    )
    assert result["success"] is True, result
    assert env.read_file("h.txt") == b"c\nb\nc\nD\nB\n"
    overlap = "*** Begin Patch\n*** Update File: h.txt\n@@\n-c\n-b\n+x\n@@\n-b\n+y\n*** End Patch"
    error = call(ctx, "patch", mode="patch", patch=overlap)["error"]
    assert error == "Could not apply hunk 2 to h.txt: it overlaps the lines of another hunk"
    assert env.read_file("h.txt") == b"c\nb\nc\nD\nB\n"


@pytest.mark.parametrize(
    ("first", "changed", "tail"), [(5000, 1, ""), (5000, 10, ""), (5000, 3000, ""), (19_995, 5, "end")]
)
def test_patch_diff_is_a_valid_unified_diff_of_the_file(env, tmp_path, first, changed, tail):
    """The diff in a patch result applies with ``git apply`` (context and line numbers exact),
    also when the changed region is too long to be diffed line by line (3000 lines) and when
    the new last line has no newline."""
    import subprocess

    ctx = make_ctx(env, tool_result_max_chars=200_000)
    before = "".join(f"line {i}\n" for i in range(20_000))
    lines = before.splitlines(keepends=True)
    for i in range(first, first + changed):
        lines[i] = f"changed {i}\n" if i % 2 else ""  # replaced and deleted lines
    after = "".join(lines) + tail
    env.write_file("d.txt", before.encode())
    result = call(ctx, "patch", path="d.txt", old_string=before, new_string=after)
    assert result["success"] is True
    diff = result["diff"]
    assert diff.startswith(f"--- a/d.txt\n+++ b/d.txt\n@@ -{first - 2},") and "\\ diff cut" not in diff
    assert ("\\ No newline at end of file" in diff) == bool(tail)
    (tmp_path / "d.txt").write_text(before)
    (tmp_path / "d.diff").write_text(diff)
    subprocess.run(["git", "apply", "d.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "d.txt").read_text() == after == env.read_file("d.txt").decode()


def test_patch_diff_of_a_rewritten_file_is_cut_but_the_edit_is_whole(ctx, env):
    before = "".join(f"old {i}\n" for i in range(50_000))
    after = "".join(f"new {i}\n" for i in range(50_000))
    env.write_file("r.txt", before.encode())
    result = call(ctx, "patch", path="r.txt", old_string=before, new_string=after)
    assert result["success"] is True and env.read_file("r.txt") == after.encode()
    diff = result["diff"]
    assert diff.startswith("--- a/r.txt\n+++ b/r.txt\n@@ -1,50000 +1,50000 @@\n-old 0\n-old 1\n")
    kept = diff.count("\n-old ")  # half the tool result bound (100,000 characters) is the diff's
    assert len(diff) <= 50_000 and kept > 4500  # about 10 characters a line
    assert diff.endswith(f"\\ diff cut: {100_000 - kept} more lines\n")


# -- search_files ------------------------------------------------------------------

ENGINES = [
    "grep",
    pytest.param("rg", marks=pytest.mark.skipif(not shutil.which("rg"), reason="ripgrep missing")),
]


@pytest.fixture(params=ENGINES)
def search_ctx(request, env):
    env.write_file("src/app.py", b"import os\n\ndef run():\n    return os.getcwd()\n")
    env.write_file("src/lib/util.py", b"def util():\n    return 1\n# TODO: more\n")
    env.write_file("notes.txt", b"TODO: write docs\nTODO: tests\n")
    env.write_file("many.txt", "".join(f"item {i}\n" for i in range(1, 11)).encode())
    context = make_ctx(env)
    context.state["file"] = {"search": request.param}
    return context


def test_search_content_regex(search_ctx):
    result = call(search_ctx, "search_files", pattern="^def [a-z]+\\(", path="src")
    assert result["total_count"] == 2 and result["truncated"] is False
    assert sorted((m["path"], m["line"], m["content"]) for m in result["matches"]) == [
        ("src/app.py", 3, "def run():"),
        ("src/lib/util.py", 1, "def util():"),
    ]
    globbed = call(search_ctx, "search_files", pattern="TODO", file_glob="*.py")
    assert [(m["path"], m["line"]) for m in globbed["matches"]] == [("./src/lib/util.py", 3)]
    assert call(search_ctx, "search_files", pattern="zzz_nothing") == {
        "total_count": 0,
        "matches": [],
        "truncated": False,
    }


def test_search_limit_offset_and_context(search_ctx):
    page = call(search_ctx, "search_files", pattern="item", path="many.txt", limit=3, offset=3)
    assert [(m["path"], m["line"], m["content"]) for m in page["matches"]] == [
        ("many.txt", 4, "item 4"),
        ("many.txt", 5, "item 5"),
        ("many.txt", 6, "item 6"),
    ]
    assert page["total_count"] == 10 and page["truncated"] is True
    assert page["hint"] == "Results truncated. Use offset=6 to see more."
    around = call(search_ctx, "search_files", pattern="getcwd", path="src/app.py", context=1)
    assert [(m["line"], m["content"]) for m in around["matches"]] == [
        (3, "def run():"),
        (4, "    return os.getcwd()"),
    ]


def test_search_count_and_files_only(search_ctx):
    counts = call(search_ctx, "search_files", pattern="TODO", output_mode="count")
    assert counts == {
        "total_count": 3,
        "counts": {"./notes.txt": 2, "./src/lib/util.py": 1},
        "truncated": False,
    }
    files = call(search_ctx, "search_files", pattern="TODO", output_mode="files_only")
    assert sorted(files["files"]) == ["./notes.txt", "./src/lib/util.py"] and files["total_count"] == 2


def test_search_files_by_glob(search_ctx, env):
    env.execute("touch -d '2020-01-01' src/app.py")
    result = call(search_ctx, "search_files", pattern="*.py", target="files", path="src")
    assert result == {"total_count": 2, "files": ["src/lib/util.py", "src/app.py"], "truncated": False}
    assert call(search_ctx, "search_files", pattern="*.md", target="files")["files"] == []


def test_search_errors(search_ctx):
    assert call(search_ctx, "search_files", pattern="x", path="missing") == {
        "error": "Path not found: missing"
    }
    assert call(search_ctx, "search_files", pattern="(unclosed")["error"].startswith(
        "Invalid regular expression"
    )
