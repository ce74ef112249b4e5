"""The progress artifact's update thread (flows.progress.LatestOnly): newest value wins, never overtaken."""

from __future__ import annotations

import threading

from flows.progress import LatestOnly, RunProgress


def test_the_dispatcher_never_waits_and_only_the_newest_value_is_sent():
    sent: list[int] = []
    started, slow = threading.Event(), threading.Event()

    def send(value: int) -> None:
        if value == 0:
            started.set()
            slow.wait(10)  # the API is slow: the first update hangs
        sent.append(value)

    pusher = LatestOnly(send)
    pusher.offer(0)
    assert started.wait(5)
    for value in range(1, 50):
        pusher.offer(value)  # returns at once while the first send hangs
    assert sent == []
    slow.set()
    pusher.close()
    assert sent == [0, 49]  # the values offered meanwhile collapse into the newest


def test_send_now_is_not_overtaken_by_an_older_offer():
    sent: list[str] = []
    started, gate = threading.Event(), threading.Event()

    def send(value: str) -> None:
        if value == "first":
            started.set()
            gate.wait(10)
        sent.append(value)

    pusher = LatestOnly(send)
    pusher.offer("first")
    assert started.wait(5)
    pusher.offer("stale")  # still waiting when the final value comes
    threading.Timer(0.2, gate.set).start()
    pusher.send_now("final")  # waits for the send in progress, drops "stale"
    pusher.close()
    assert sent == ["first", "final"]


def test_a_failed_send_is_dropped_and_the_next_value_goes_out():
    sent: list[int] = []

    def send(value: int) -> None:
        if value == 1:
            raise ConnectionError("the API is down")
        sent.append(value)

    pusher = LatestOnly(send)
    pusher.send_now(1)
    pusher.send_now(2)
    pusher.close()
    assert sent == [2]


def test_the_description_shows_the_pass_rate_and_the_skipped_samples():
    run = RunProgress(run_name="unit", total=12)
    run.record("completed")  # not scored: no pass figure yet
    assert run.describe() == "1/12 prompts of unit in this flow run (0 failed)"
    for passed in (True, False, True):
        run.record("completed", passed=passed)
    run.record("discarded")
    run.record("failed")
    run.skip()  # --stop_when_passed: the sample leaves the total
    assert run.describe() == "6/11 prompts of unit in this flow run (1 failed, 1 skipped) · pass 2/3"
    assert run.percent == round(100 * 6 / 11, 1)
