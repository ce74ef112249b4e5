"""The run folder's file names and layout: the one place that spells them (README § Outputs).

Every module that reads or writes a run folder asks :class:`RunFolder` for a file's path (or
takes a name constant below) instead of spelling the name itself.

=================================  =======================================================================
file (in ``data/<run_name>``)      format
=================================  =======================================================================
``run.json``                       JSON: defining settings, dataset fingerprint, invocation history
                                   (:mod:`hermes_core.runfolder.run_info`)
``batch_<n>.jsonl``                JSONL: the trajectory rows of batch n, appended with flush + fsync
                                   (:mod:`hermes_core.runfolder.ledger`)
``discarded.jsonl``                JSONL: one tombstone per sample discarded for lack of reasoning
``failures.jsonl``                 JSONL: one line per prompt that failed in an invocation
``cancelled.jsonl``                JSONL: what prompts cancelled mid-way spent (``usage``)
``spend.json``                     JSON, one line: the usage of every ledger file, summed per file
                                   (:mod:`hermes_core.runfolder.spend`)
``checkpoint.json``                JSON, one line: ``{run_name, completed_prompts, batch_stats, last_updated}``
``.ledger-index.jsonl``            JSONL: one line per closed batch file (name, size, mtime, prompt ids)
``trajectories.jsonl``             JSONL: the merged rows, ordered by prompt_index
                                   (:mod:`hermes_core.runfolder.postprocess`)
``.merge-state.<f>.json``          JSON: what the merge into ``<f>`` and its statistics computed
``statistics.json``                JSON: the run's statistics (``compute-statistics``)
``scores.jsonl``                   JSONL: scores given to existing rows by ``hermes-batch score``, newest
                                   last (:mod:`hermes_core.runfolder.rescores`)
``pilot.json``                     JSON: the report of a ``--pilot`` run (:mod:`flows.pilot`)
``trajectories_compressed.jsonl``  JSONL: ``trajectories.jsonl`` compressed to a token budget
                                   (:mod:`hermes_core.compression`), rows in the same order
``compression_metrics.json``       JSON: the last compression's totals, settings and per-row metrics
``compression.jsonl``              JSONL: the compression's per-row cache (token counts, region, summary),
                                   append-only, fsynced after each paid summary
``.prefect-results/``              folder: the task result cache (default location, ``--result_storage``)
``.view-index.parquet``            Parquet: the viewer's index of the run (:mod:`flows.viewer.index`), or in
                                   a temp folder when the run folder is read-only
``.view-index.json``               JSON: what the viewer's index was built from
``.lock``                          text: the pid of the invocation holding the folder's ``flock``
=================================  =======================================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BATCH_RE",
    "CANCELLED_FILE",
    "CHECKPOINT_FILE",
    "COMPRESSED_FILE",
    "COMPRESSION_CACHE_FILE",
    "COMPRESSION_METRICS_FILE",
    "DISCARDED_FILE",
    "REJECTED_FILE",
    "FAILURES_FILE",
    "LEDGER_FILES",
    "LEDGER_INDEX_FILE",
    "LOCK_FILE",
    "MERGE_STATE_PREFIX",
    "PILOT_FILE",
    "RESULTS_DIR",
    "RUN_FILE",
    "RunFolder",
    "SCORES_FILE",
    "SIDE_COST_FILES",
    "SPEND_FILE",
    "STATISTICS_FILE",
    "TRAJECTORIES_FILE",
    "VIEW_INDEX_FILE",
    "VIEW_INDEX_META_FILE",
    "batch_name",
    "is_ledger_file",
    "merge_state_name",
]

RUN_FILE = "run.json"
TRAJECTORIES_FILE = "trajectories.jsonl"
REJECTED_FILE = "rejected.jsonl"
STATISTICS_FILE = "statistics.json"
SCORES_FILE = "scores.jsonl"
DISCARDED_FILE = "discarded.jsonl"
FAILURES_FILE = "failures.jsonl"
CANCELLED_FILE = "cancelled.jsonl"
SPEND_FILE = "spend.json"
CHECKPOINT_FILE = "checkpoint.json"
LEDGER_INDEX_FILE = ".ledger-index.jsonl"
PILOT_FILE = "pilot.json"
COMPRESSED_FILE = "trajectories_compressed.jsonl"
COMPRESSION_METRICS_FILE = "compression_metrics.json"
COMPRESSION_CACHE_FILE = "compression.jsonl"
RESULTS_DIR = ".prefect-results"
LOCK_FILE = ".lock"
VIEW_INDEX_FILE = ".view-index.parquet"
VIEW_INDEX_META_FILE = ".view-index.json"
MERGE_STATE_PREFIX = ".merge-state."
"""Names of the merge's state files start with this (``.merge-state.<merged file>.json``)."""

BATCH_RE = re.compile(r"^batch_(\d+)\.jsonl$")
"""Names of a run's batch files, ``batch_<n>.jsonl`` (group 1: n)."""

LEDGER_FILES = (DISCARDED_FILE, FAILURES_FILE, CANCELLED_FILE)
"""The ledger's append-only files besides the batch files, in the order the ledger repairs them."""


def batch_name(number: int) -> str:
    """The name of batch ``number``'s file, ``batch_<number>.jsonl`` (matched by :data:`BATCH_RE`)."""
    return f"batch_{number}.jsonl"


def merge_state_name(merged_name: str) -> str:
    """The name of the merge state file of merged file ``merged_name``: ``.merge-state.<merged_name>.json``."""
    return f"{MERGE_STATE_PREFIX}{merged_name}.json"


SIDE_COST_FILES = (COMPRESSION_CACHE_FILE, SCORES_FILE)
"""Files whose lines carry the usage of a run's side requests (summaries, ``hermes-batch score``'s
judge): the run paid for them, but they are no prompt records (:mod:`hermes_core.runfolder.spend`)."""


def is_ledger_file(name: str) -> bool:
    """True for the name of a file whose lines carry a ``usage`` the run paid for: a batch file, one of
    :data:`LEDGER_FILES` or of :data:`SIDE_COST_FILES`."""
    return name in LEDGER_FILES or name in SIDE_COST_FILES or BATCH_RE.match(name) is not None


@dataclass(frozen=True)
class RunFolder:
    """A run folder's paths (nothing is read, written or created here; see the module docstring's table).

    Attributes:
        path: the run folder (``data/<run_name>``), as given.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def run_json(self) -> Path:
        """``run.json``: the run's settings, dataset fingerprint and invocation history."""
        return self.path / RUN_FILE

    @property
    def trajectories(self) -> Path:
        """``trajectories.jsonl``: the merged output."""
        return self.path / TRAJECTORIES_FILE

    @property
    def statistics(self) -> Path:
        """``statistics.json``: the run's statistics."""
        return self.path / STATISTICS_FILE

    @property
    def rejected(self) -> Path:
        """``rejected.jsonl``: the rows the merge's ``--keep`` filter left out, with their scores."""
        return self.path / REJECTED_FILE

    @property
    def scores(self) -> Path:
        """``scores.jsonl``: scores of existing rows given after the run (``hermes-batch score``)."""
        return self.path / SCORES_FILE

    @property
    def discarded(self) -> Path:
        """``discarded.jsonl``: tombstones of samples discarded for lack of reasoning."""
        return self.path / DISCARDED_FILE

    @property
    def failures(self) -> Path:
        """``failures.jsonl``: one line per failed prompt per invocation."""
        return self.path / FAILURES_FILE

    @property
    def cancelled(self) -> Path:
        """``cancelled.jsonl``: the spend of prompts cancelled mid-way."""
        return self.path / CANCELLED_FILE

    @property
    def spend(self) -> Path:
        """``spend.json``: the ledger files' usage, summed per file."""
        return self.path / SPEND_FILE

    @property
    def checkpoint(self) -> Path:
        """``checkpoint.json``: finished prompts and per-batch counts."""
        return self.path / CHECKPOINT_FILE

    @property
    def ledger_index(self) -> Path:
        """``.ledger-index.jsonl``: the prompt ids of each closed batch file."""
        return self.path / LEDGER_INDEX_FILE

    @property
    def pilot(self) -> Path:
        """``pilot.json``: the report of a ``--pilot`` run."""
        return self.path / PILOT_FILE

    @property
    def compressed(self) -> Path:
        """``trajectories_compressed.jsonl``: the merged rows compressed to a token budget."""
        return self.path / COMPRESSED_FILE

    @property
    def compression_metrics(self) -> Path:
        """``compression_metrics.json``: the last compression's totals, settings and per-row metrics."""
        return self.path / COMPRESSION_METRICS_FILE

    @property
    def compression_cache(self) -> Path:
        """``compression.jsonl``: the compression's per-row cache."""
        return self.path / COMPRESSION_CACHE_FILE

    @property
    def results(self) -> Path:
        """``.prefect-results/``: the default folder of the task result cache."""
        return self.path / RESULTS_DIR

    @property
    def lock(self) -> Path:
        """``.lock``: the file the invocation holding the folder locks."""
        return self.path / LOCK_FILE

    @property
    def view_index(self) -> Path:
        """``.view-index.parquet``: the viewer's index of the run (when the folder is writable)."""
        return self.path / VIEW_INDEX_FILE

    @property
    def view_index_meta(self) -> Path:
        """``.view-index.json``: what the viewer's index was built from."""
        return self.path / VIEW_INDEX_META_FILE

    def batch(self, number: int) -> Path:
        """``batch_<number>.jsonl``: the rows of batch ``number``."""
        return self.path / batch_name(number)

    def merge_state(self, merged_name: str = TRAJECTORIES_FILE) -> Path:
        """``.merge-state.<merged_name>.json``: what the merge into ``merged_name`` computed."""
        return self.path / merge_state_name(merged_name)

    def batch_files(self) -> list[Path]:
        """The folder's ``batch_<n>.jsonl`` files, sorted by n (numerically).

        Raises:
            OSError: the folder cannot be listed (FileNotFoundError when it is missing).
        """
        found = []
        for path in self.path.iterdir():
            match = BATCH_RE.match(path.name)
            if match and path.is_file():
                found.append((int(match.group(1)), path))
        return [path for _, path in sorted(found)]
