"""Sandbox preparation of a run, before any prompt talks to the model (docker backend).

One task: remove the containers an earlier crashed run of the same run name left behind,
then check each distinct image once (pulling when allowed). An unreachable engine fails the
task, so the flow refuses to start instead of failing every prompt.
"""

from __future__ import annotations

from prefect import get_run_logger, task

from hermes_core.environments import container_image
from hermes_core.environments.docker_engine import check_images, reap_run_containers
from hermes_core.runner import PromptJob
from hermes_core.settings import HermesSettings
from tasks.ledger import RunLedger

CONTAINER_BACKENDS = frozenset({"docker"})
"""Backends whose images are checked before the run (singularity and modal fetch images themselves)."""


def image_of(job: PromptJob, settings: HermesSettings) -> str:
    """The image a prompt runs in (:func:`hermes_core.environments.container_image`)."""
    return container_image(job.image, settings)


@task(name="prepare-sandboxes", persist_result=False)
def prepare_sandboxes_task(run_id: str, jobs: list[PromptJob], backend: str) -> dict[str, str]:
    """Reap the run's leftover containers (labelled with the run folder's id) and check the images of ``jobs``.

    Returns:
        ``{image: reason}`` for images that cannot be used (their prompts must fail); empty
        when every image is ready or the backend is not a container backend.

    Raises:
        EngineUnavailable: the Docker engine cannot be reached.
    """
    if backend not in CONTAINER_BACKENDS:
        return {}
    logger = get_run_logger()
    settings = HermesSettings()
    removed = reap_run_containers(run_id)
    if removed:
        logger.warning("removed %d container(s) left by an earlier invocation of this run", len(removed))
    images = sorted({image_of(job, settings) for job in jobs})
    problems = check_images(images, settings)
    for reason in problems.values():
        logger.error("%s", reason)
    logger.info("images ready: %s", ", ".join(i for i in images if i not in problems) or "none")
    return problems


def prepare_sandboxes(
    run_id: str, pending: list[PromptJob], backend: str, ledger: RunLedger
) -> tuple[list[PromptJob], list[dict]]:
    """Flow step: run :func:`prepare_sandboxes_task`, fail the prompts whose image is unavailable.

    Each such prompt gets a ``failures.jsonl`` line (error type ``ImageUnavailable``, the
    message naming the image, ``attempts`` 0: nothing was sent to the model).

    Returns:
        (the prompts still to run, the failure lines written here).

    Raises:
        EngineUnavailable: the Docker engine cannot be reached (the run must not start).
    """
    problems = prepare_sandboxes_task(run_id, pending, backend)
    if not problems:
        return pending, []
    settings = HermesSettings()
    runnable, failed = [], []
    for job in pending:
        reason = problems.get(image_of(job, settings))
        if reason is None:
            runnable.append(job)
        else:
            failed.append(
                ledger.record_failure(job.prompt_id, job.prompt_index, "ImageUnavailable", reason, attempts=0)
            )
    return runnable, failed
