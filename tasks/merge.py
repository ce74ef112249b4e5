"""The ``merge-trajectories`` task: batch files -> ``trajectories.jsonl``, filtered.

The filters run in the merge's single pass over the rows (a second pass over gigabytes of rows
would cost more than it separates): a row whose ``tool_stats`` names a tool outside the
registry (a hallucinated tool) is dropped, duplicates of a prompt are dropped, rows of
records no longer in the dataset are left out, and ``--keep`` leaves out rows by their score
(to ``rejected.jsonl``). Rows without reasoning never reach a batch
file: the prompt task discards them (``discarded.jsonl``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from prefect import task

from hermes_core.runfolder.postprocess import MergeResult, merge_trajectories
from hermes_core.tools import ALL_POSSIBLE_TOOLS


@task(name="merge-trajectories", persist_result=False)
def merge_task(run_dir: Path, index_of: Mapping[str, int], keep: str = "all") -> MergeResult:
    """Merge ``run_dir``'s batch files into trajectories.jsonl, in prompt order (see
    :func:`hermes_core.runfolder.postprocess.merge_trajectories`).

    Args:
        run_dir: the run folder.
        index_of: prompt_id -> prompt_index of the current dataset.
        keep: the filter by score (``--keep``: all, passed, best); the rows it leaves out go to
            rejected.jsonl.
    """
    return merge_trajectories(run_dir, index_of=index_of, valid_tools=ALL_POSSIBLE_TOOLS, keep=keep)
