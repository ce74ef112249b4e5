"""Bounded command output shared by every backend: the first 40% and a rolling last 60% of a limit."""

from __future__ import annotations

import codecs


class BoundedOutput:
    """Decoded output kept as the first 40% and a rolling last 60% of ``max_chars``.

    Memory stays O(max_chars) whatever the command prints. Feed it raw bytes (decoded as UTF-8,
    invalid bytes replaced); :meth:`result` gives the text with the reference's middle marker when cut.
    """

    def __init__(self, max_chars: int):
        self.head_max = int(max_chars * 0.4)
        self.tail_max = max_chars - self.head_max
        self.head = ""
        self.tail = ""
        self.total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final=final)
        if not text:
            return
        self.total += len(text)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += text[:room]
            text = text[room:]
        if text:
            self.tail = (self.tail + text)[-self.tail_max :]

    def result(self) -> tuple[str, bool]:
        """(text, truncated); a cut text has the reference's middle marker."""
        kept = len(self.head) + len(self.tail)
        if kept >= self.total:
            return self.head + self.tail, False
        omitted = self.total - kept
        marker = f"\n... [OUTPUT TRUNCATED - {omitted} chars omitted out of {self.total} total] ...\n"
        return self.head + marker + self.tail, True


__all__ = ["BoundedOutput"]
