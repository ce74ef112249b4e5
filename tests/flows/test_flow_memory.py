"""The flow forgets Prefect's per-task bookkeeping of recorded prompts (memory flat in the number of prompts)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_forget_drops_a_recorded_prompts_bookkeeping_and_only_its(prefect_server):
    from prefect import flow, task
    from prefect.context import FlowRunContext
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.task_runners import ThreadPoolTaskRunner

    from flows.prefect_adapter import forget_task_run
    from hermes_core.runner import PromptOutcome

    @task(persist_result=False)
    def outcome(i: int) -> PromptOutcome:
        return PromptOutcome(
            prompt_id=f"p{i}", prompt_index=1000 + i, status="kept", row={"prompt_index": 1000 + i},
            assistant_turns=1, turns_with_reasoning=1, usage={"prompt_tokens": 1}, duration_s=0.5 + i,
        )  # fmt: skip

    def kept(context, runner, future) -> tuple[int, bool, bool]:
        entries = sum(
            1
            for state, *_ in context.run_results.values()
            if state.state_details.task_run_id == future.task_run_id
        )
        return (
            entries,
            future.task_run_id in runner._cancel_events,
            future.task_run_id in context.task_run_assets,
        )

    @flow(persist_result=False)
    def probe() -> dict:
        context = FlowRunContext.get()
        with ThreadPoolTaskRunner(max_workers=2) as runner:
            first, second = runner.submit(outcome, {"i": 1}), runner.submit(outcome, {"i": 2})
            first.wait(), second.wait()
            before, other = kept(context, runner, first), kept(context, runner, second)
            forget_task_run(runner, first, first.state.result())
            after = kept(context, runner, first), kept(context, runner, second)
            return {"before": before, "after": after[0], "other": (other, after[1])}

    with temporary_settings({PREFECT_API_URL: prefect_server}):
        seen = probe()
        APILogWorker.drain_all(timeout=5)  # send the flow's logs while the server is up
    # the outcome and its fields other than small ints (row, usage, prompt_id, prompt_index, duration_s;
    # the interned "completed" goes to whichever task finished last) were linked to the task's state
    entries, cancel_event, assets = seen["before"]
    assert entries >= 6 and cancel_event and assets
    assert seen["after"] == (0, False, False)
    other_before, other_after = seen["other"]
    assert other_before == other_after and other_before[0] >= 6


def test_memory_per_recorded_prompt_stays_flat(prefect_server):
    """Traced memory after 1,100 and after 2,100 recorded prompts: the growth per prompt is bounded.

    Both points are past Prefect's own bounded cache of the last 1,000 task results.
    """
    import tracemalloc

    from prefect import flow, task
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.task_runners import ThreadPoolTaskRunner

    from flows.prefect_adapter import forget_task_run
    from hermes_core.runner import PromptOutcome

    @task(persist_result=False)
    def outcome(i: int) -> PromptOutcome:
        return PromptOutcome(
            prompt_id=f"p{i}", prompt_index=i, status="kept", row={"prompt_index": i, "pad": "x" * 2000},
            assistant_turns=1, turns_with_reasoning=1, usage={"prompt_tokens": i}, duration_s=0.5,
        )  # fmt: skip

    @flow(persist_result=False)
    def many(n: int) -> list[int]:
        traced = []
        with ThreadPoolTaskRunner(max_workers=4) as runner:
            for i in range(n):
                future = runner.submit(outcome, {"i": i})
                future.wait()
                forget_task_run(runner, future, future.state.result())
                if i + 1 in (1100, n):
                    traced.append(tracemalloc.get_traced_memory()[0])
        return traced

    with temporary_settings({PREFECT_API_URL: prefect_server}):
        tracemalloc.start()
        try:
            at_1100, at_2100 = many(2100)
        finally:
            tracemalloc.stop()
        APILogWorker.drain_all(timeout=5)
    per_prompt = (at_2100 - at_1100) / 1000
    # a kept 2 KB row plus Prefect's ~3 KB of bookkeeping per prompt (what forget_task_run drops) would show
    # as ~5 KB; measured here 0.5-2.9 KB (allocator and logging noise vary from run to run)
    assert per_prompt < 4500, f"{per_prompt:.0f} bytes per recorded prompt"
