"""The ``read-dataset`` task: the JSONL dataset, validated, before any prompt runs."""

from __future__ import annotations

from prefect import get_run_logger, task

from hermes_core.dataset import Dataset, read_dataset
from hermes_core.runfolder.run_info import check_cwds
from hermes_core.settings import HermesSettings


@task(name="read-dataset", persist_result=False)
def read_dataset_task(config, settings: HermesSettings) -> Dataset:
    """Read and validate the JSONL dataset of ``config`` (a :class:`~flows.config.BatchConfig`).

    Records are line-numbered; ``config.skip_invalid`` skips bad lines (each logged as a warning).

    Raises:
        DatasetError: a bad line (without ``skip_invalid``), or records whose ``cwd`` the local
            sandbox refuses (each with its line number), before any prompt runs or is paid for.
    """
    dataset = read_dataset(
        config.dataset_file, max_samples=config.max_samples, skip_invalid=config.skip_invalid, reuse=True
    )
    check_cwds(config, dataset, settings)
    for line, reason in dataset.invalid:
        get_run_logger().warning("skipped invalid line %s of %s: %s", line, config.dataset_file, reason)
    return dataset
