"""What a run has spent, counted from its ledger without re-reading it at every start.

Every ledger line that cost something carries a ``usage`` (``{prompt_tokens, completion_tokens,
reasoning_tokens, cost}``): trajectory rows (``metadata.usage``), discard tombstones and failure
lines (``usage``), and the run's side requests: the compression's summaries (``compression.jsonl``)
and ``hermes-batch score``'s judge (``scores.jsonl``), whose cost counts but which are no prompt
records. The run's spend is their sum, over every invocation.

A resume must not JSON-parse every row of a million-row run, so ``spend.json`` keeps the sum
per ledger file with the file's size when it was counted::

    {"version": 1, "files": {"batch_3.jsonl": {"size": 81234, "prompt_tokens": ..., ...}, ...}}

It is rewritten (atomically) with every checkpoint. :meth:`SpendTally.load` trusts an entry
whose file still has that size; a file that grew since (appended after the last checkpoint,
e.g. by a killed invocation) has only its new bytes parsed; a file that shrank (a torn tail
repaired) or has no entry (no ``spend.json``: an older run) is parsed whole. So a resume reads
one small file plus, at most, what was written after the last checkpoint. Ledger files are
append-only, which is what makes a size a sound staleness check.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hermes_core.runfolder.files import write_json_atomic
from hermes_core.runfolder.folder import SIDE_COST_FILES, RunFolder, is_ledger_file
from hermes_core.usage import Usage


@dataclass
class Spend:
    """Summed usage of ledger lines.

    Attributes:
        records: usage records counted (rows, tombstones, failure lines).
        prompt_tokens / completion_tokens: tokens.
        cost: USD the provider reported (only records that report a cost).
        unpriced_prompt_tokens / unpriced_completion_tokens: tokens of records without a reported
            cost (priced with ``--price_per_mtok_in`` / ``--price_per_mtok_out`` when given).
        cost_reports: records that reported a cost.
    """

    records: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    unpriced_prompt_tokens: int = 0
    unpriced_completion_tokens: int = 0
    cost_reports: int = 0

    @property
    def total_tokens(self) -> int:
        """prompt + completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def add_usage(self, usage: Usage | dict[str, Any] | None, *, record: bool = True) -> None:
        """Count one record's usage: a :class:`~hermes_core.usage.Usage`, or its stored dict form
        (read with :meth:`Usage.from_dict <hermes_core.usage.Usage.from_dict>`; None or malformed:
        a record that spent nothing known). ``record`` False: a cost that is not a prompt's own
        record (a summary of the compression), added without counting a record."""
        if not isinstance(usage, Usage):
            usage = Usage.from_dict(usage)
        self.records += record
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        if usage.cost is not None:
            self.cost += usage.cost
            self.cost_reports += 1
        else:
            self.unpriced_prompt_tokens += usage.prompt_tokens
            self.unpriced_completion_tokens += usage.completion_tokens

    def merge(self, other: Spend) -> None:
        """Add ``other`` into this spend."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def cost_usd(self, price_in: float | None = None, price_out: float | None = None) -> float | None:
        """USD spent: reported cost plus unpriced tokens at the prices (USD per million tokens).

        None when nothing reported a cost and no price is given.
        """
        if not self.cost_reports and price_in is None and price_out is None:
            return None
        priced = (self.unpriced_prompt_tokens * (price_in or 0.0)) + (
            self.unpriced_completion_tokens * (price_out or 0.0)
        )
        return self.cost + priced / 1_000_000


class SpendTally:
    """The spend of a run folder, per ledger file, kept current by the ledger. Build with :meth:`load`.

    Attributes:
        total: the run's spend (every file), updated by :meth:`add` in O(1).
        reparsed: ledger files (or their tails) parsed by :meth:`load` because ``spend.json`` did
            not cover them.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.total = Spend()
        self.reparsed: list[str] = []
        self._files: dict[str, Spend] = {}
        self._sizes: dict[str, int] = {}  # bytes of each file counted, kept as lines are appended

    @classmethod
    def load(cls, run_dir: Path) -> SpendTally:
        """Read ``spend.json`` and bring it up to date with the ledger files (see the module docstring).

        Call after torn tails are repaired. An unreadable ``spend.json`` counts as missing.
        """
        tally = cls(run_dir)
        saved: dict[str, Any] = {}
        try:
            saved = json.loads(RunFolder(tally.run_dir).spend.read_text(encoding="utf-8")).get("files", {})
        except (OSError, ValueError, AttributeError):
            saved = {}
        names = sorted(p.name for p in tally.run_dir.iterdir() if is_ledger_file(p.name))
        for name in names:
            size = os.path.getsize(tally.run_dir / name)
            entry = saved.get(name) if isinstance(saved.get(name), dict) else None
            counted = (
                Spend(**{f.name: entry[f.name] for f in fields(Spend) if f.name in entry}) if entry else None
            )
            recorded = int(entry.get("size", -1)) if entry else -1
            if counted is not None and recorded == size:
                spend = counted
            elif counted is not None and 0 <= recorded < size:
                spend = counted
                spend.merge(_parse(tally.run_dir / name, offset=recorded))
                tally.reparsed.append(f"{name}[{recorded}:]")
            else:
                spend = _parse(tally.run_dir / name, offset=0)
                tally.reparsed.append(name)
            tally._files[name] = spend
            tally._sizes[name] = size
            tally.total.merge(spend)
        return tally

    def add(self, file_name: str, usage: dict[str, Any] | None, size: int) -> None:
        """Count a usage record of ``size`` bytes just appended to ledger file ``file_name``."""
        self._files.setdefault(file_name, Spend()).add_usage(usage)
        self._sizes[file_name] = self._sizes.get(file_name, 0) + size
        self.total.add_usage(usage)

    def save(self) -> None:
        """Write ``spend.json`` (atomically, one line) with the size of each file as counted.

        The sizes are kept in memory as lines are appended (no ``stat`` per file: a run of 10^6
        prompts has 10^4 batch files, and this runs with every checkpoint).
        """
        files = {
            name: {"size": self._sizes[name], **asdict(spend)} for name, spend in sorted(self._files.items())
        }
        write_json_atomic(RunFolder(self.run_dir).spend, {"version": 1, "files": files}, indent=None)


def _parse(path: Path, offset: int) -> Spend:
    """Sum the usage of the JSON lines of ``path`` from byte ``offset`` (rows: ``metadata.usage``)."""
    spend = Spend()
    summaries = path.name in SIDE_COST_FILES
    with open(path, "rb") as fh:
        fh.seek(offset)
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a torn line: the ledger repairs it
            if not isinstance(obj, dict):
                continue
            metadata = obj.get("metadata")
            usage = metadata.get("usage") if isinstance(metadata, dict) else obj.get("usage")
            if summaries:  # a side request's cost is the run's, but it is no prompt record
                if usage:
                    spend.add_usage(usage, record=False)
                continue
            spend.add_usage(usage)
    return spend


__all__ = ["Spend", "SpendTally"]
