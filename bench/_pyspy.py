"""Summaries of py-spy ``--format raw`` profiles (collapsed stacks): where the CPU samples go.

``python bench/_pyspy.py PROFILE.txt [--top 30] [--match SUBSTR]`` prints the functions with
the most samples, inclusive (the function is anywhere on the stack) and self (it is the leaf).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME_RE = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _frames(stack: str) -> list[str]:
    out = []
    for frame in stack.split(";"):
        m = _FRAME_RE.match(frame.strip())
        out.append(f"{m['func']} ({m['file']})" if m else frame.strip())
    return out


def summarize(path: Path, top: int = 30, match: str | None = None) -> str:
    """Text report of the top inclusive and self functions of a raw py-spy profile."""
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        if match and match not in stack:
            continue
        total += n
        frames = _frames(stack)
        for f in set(frames):
            inclusive[f] += n
        leaf[frames[-1]] += n
    lines = [f"{path.name}: {total} samples" + (f" (stacks containing {match!r})" if match else "")]
    lines.append("-- inclusive --")
    for f, n in inclusive.most_common(top):
        lines.append(f"{100 * n / max(total, 1):6.1f}%  {f}")
    lines.append("-- self --")
    for f, n in leaf.most_common(top):
        lines.append(f"{100 * n / max(total, 1):6.1f}%  {f}")
    return "\n".join(lines)


def main() -> None:
    """Command line: print the summary of one profile."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--match", default=None)
    args = p.parse_args()
    print(summarize(args.profile, args.top, args.match))


if __name__ == "__main__":
    main()
