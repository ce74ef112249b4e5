"""Host-side work of the tools on huge input: seconds for the worst cases found, each linear now.

Times, in this process (no sandbox, no model), the pure functions a tool call runs on the host:

* ``patch`` finding a 1,000-line block in a 200,000-line file where it is absent and every
  line but the last matches (was a window-by-window comparison: 25.9 s on this machine);
* ``patch`` applying 1,000 hunks to a 100,000-line file (was a copy of the file per hunk);
* the diff of two 100,000-line files with every second line changed (was difflib over the
  whole files: 165 s), and with one line changed;
* the exit-code explanation of a failed 50 MB command (was ``shlex.split`` of all of it, over
  10 min; the command is now refused above 128 KiB, and only its last characters are read).

Prints one line per case: its name and the best of ``--repeat`` runs in seconds.

Usage:
    python bench/tool_host_work.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from hermes_core.tools.file import apply_hunks, find_block, unified_diff
from hermes_core.tools.terminal import exit_code_meaning


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Run each case and print ``name  seconds``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    equal = ["x"] * 200_000
    numbered = "".join(f"line {i}\n" for i in range(100_000))
    half_changed = "".join(f"line {i}\n" if i % 2 else f"other {i}\n" for i in range(100_000))
    one_changed = numbered.replace("line 50000\n", "LINE\n")
    hunks = [
        part for i in range(0, 100_000, 100) for part in ("@@", f" line {i}", f"-line {i + 1}", f"+L{i + 1}")
    ]
    command = "echo " + "a" * 50_000_000
    cases = {
        "patch: absent 1,000-line block in 200,000 lines": lambda: find_block(
            {}, equal, ["x"] * 999 + ["y"], 0
        ),
        "patch: 1,000 hunks on 100,000 lines": lambda: apply_hunks("f", numbered, hunks),
        "diff: 100,000 lines, every second changed": lambda: unified_diff(
            "f", numbered, half_changed, 50_000
        ),
        "diff: 100,000 lines, one changed": lambda: unified_diff("f", numbered, one_changed, 50_000),
        "exit code meaning: 50 MB command": lambda: exit_code_meaning(command, 127),
    }
    for name, fn in cases.items():
        print(f"{name:<52} {_best(fn, repeat):8.3f} s")


if __name__ == "__main__":
    main()
