"""Sandbox preparation of a run, before any prompt talks to the model (docker backend).

One task: remove the containers an earlier crashed run of the same run name left behind,
then check each distinct image once (pulling when allowed). An unreachable engine fails the
task, so the flow refuses to start instead of failing every prompt.
"""

from __future__ import annotations

from prefect import get_run_logger, task

from hermes_core.dataset import Dataset
from hermes_core.environments import container_image
from hermes_core.environments.docker_engine import check_images, reap_run_containers
from hermes_core.runfolder.ledger import RunLedger
from hermes_core.settings import HermesSettings

CONTAINER_BACKENDS = frozenset({"docker"})
"""Backends whose images are checked before the run (singularity and modal fetch images themselves)."""


def image_of(image: str | None, settings: HermesSettings) -> str:
    """The image a prompt runs in (:func:`hermes_core.environments.container_image`)."""
    return container_image(image, settings)


@task(name="prepare-sandboxes", persist_result=False)
def prepare_sandboxes_task(
    run_id: str, images: list[str], backend: str, settings: HermesSettings
) -> dict[str, str]:
    """Reap the run's leftover containers (labelled with the run folder's id) and check ``images``.

    Args:
        run_id: the run folder's identity (the containers' label).
        images: the distinct images the pending prompts use.
        backend: the sandbox backend's name (only container backends are prepared).
        settings: the run's settings (pull policy and timeout).

    Returns:
        ``{image: reason}`` for images that cannot be used (their prompts must fail); empty
        when every image is ready or the backend is not a container backend.

    Raises:
        EngineUnavailable: the Docker engine cannot be reached.
    """
    if backend not in CONTAINER_BACKENDS:
        return {}
    logger = get_run_logger()
    removed = reap_run_containers(run_id)
    if removed:
        logger.warning("removed %d container(s) left by an earlier invocation of this run", len(removed))
    problems = check_images(images, settings)
    for reason in problems.values():
        logger.error("%s", reason)
    logger.info("images ready: %s", ", ".join(i for i in images if i not in problems) or "none")
    return problems


def prepare_sandboxes(
    run_id: str,
    pending: list[int],
    dataset: Dataset,
    ids: list[str],
    backend: str,
    ledger: RunLedger,
    settings: HermesSettings,
    samples: int = 1,
) -> tuple[list[int], list[dict]]:
    """Flow step: run :func:`prepare_sandboxes_task`, fail the prompts whose image is unavailable.

    Args:
        pending: slot of each prompt to run (``prompt_index * samples + sample_index``).
        dataset: the run's dataset (the records' images are in its index: no record is read).
        ids: prompt_id of every prompt, by slot.
        settings: the run's settings (the default image).
        samples: samples per record (``--samples_per_prompt``).

    Each such prompt gets a ``failures.jsonl`` line (error type ``ImageUnavailable``, the
    message naming the image, ``attempts`` 0: nothing was sent to the model).

    Returns:
        (the slot of each prompt still to run, the failure lines written here).

    Raises:
        EngineUnavailable: the Docker engine cannot be reached (the run must not start).
    """
    images = (
        sorted({image_of(dataset.image(slot // samples), settings) for slot in pending})
        if backend in CONTAINER_BACKENDS
        else []
    )
    problems = prepare_sandboxes_task(run_id, images, backend, settings)
    if not problems:
        return pending, []
    runnable, failed = [], []
    for slot in pending:
        index = slot // samples
        reason = problems.get(image_of(dataset.image(index), settings))
        if reason is None:
            runnable.append(slot)
        else:
            failed.append(
                ledger.record_failure(ids[slot], index, "ImageUnavailable", reason, attempts=0, kind="infra")
            )
    return runnable, failed
