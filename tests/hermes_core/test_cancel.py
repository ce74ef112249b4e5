"""hermes_core.cancel: what reset() clears, and what it keeps while a stopped prompt is still ending.

In-process (the state is process-wide): each test leaves the process uncancelled.
"""

from __future__ import annotations

import threading

import pytest

from hermes_core import cancel
from hermes_core.environments.local import LocalEnvironment
from hermes_core.exceptions import PromptCancelled
from hermes_core.settings import HermesSettings
from tests.conftest import thread_inside


@pytest.fixture
def stopped_prompt():
    """A prompt thread holding a live (tracked) environment; yields the event that lets it end."""
    env = LocalEnvironment(settings=HermesSettings(local_isolation="none"))
    with thread_inside(cancel.tracked(env)) as release:
        yield release
    assert cancel.reset(wait=5)


def test_reset_keeps_the_stop_while_a_stopped_prompt_still_runs_and_clears_it_once_it_ended(stopped_prompt):
    assert cancel.cancel_running() == 1
    cancel.hold_new_prompts()
    assert cancel.reset(wait=0.2) is False  # un-cancelling would let the stopped prompt go on
    assert cancel.is_cancelled()
    with pytest.raises(PromptCancelled):
        cancel.check_may_start(retry=True)

    threading.Timer(0.3, stopped_prompt.set).start()  # the prompt ends while reset() waits
    assert cancel.reset(wait=10) is True
    assert not cancel.is_cancelled()
    cancel.check_may_start(retry=True)  # neither cancelled nor held


def test_reset_without_a_stop_returns_at_once_and_leaves_running_prompts_alone(stopped_prompt):
    assert cancel.reset(wait=0) is True  # nothing to clear: a second run beside a running one
    assert not cancel.is_cancelled()


def test_reset_waits_for_a_prompt_that_is_in_flight_outside_any_environment():
    """A stopped run's prompt waiting for a shared slot (no environment yet) still counts."""
    try:
        with thread_inside(cancel.prompt_in_flight()):
            cancel.cancel_running()
            kept = cancel.reset(wait=0.2), cancel.is_cancelled()
    finally:
        cleared = cancel.reset(wait=5)
    assert kept == (False, True)
    assert cleared is True and not cancel.is_cancelled()
