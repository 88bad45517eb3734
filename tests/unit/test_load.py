"""bench.load's senders: every request counted once, a paced closed loop's pause kept apart."""

from __future__ import annotations

import itertools
import threading
import time

from bench import load


def test_a_paced_closed_loop_waits_between_requests_and_times_only_the_request():
    starts: list[float] = []
    lock = threading.Lock()

    def call(_worker: int) -> None:
        with lock:
            starts.append(time.monotonic())
        time.sleep(0.01)

    pause = 0.05
    loop = load.ClosedLoop(call, 1, "paced", pause_s=pause)
    tally = loop.run(0.4)
    outcomes = loop.outcomes
    assert tally.ok == len(outcomes) == len(starts) >= 2
    # Each request starts after the previous one's answer and the whole pause: the next start
    # is at least its latency plus the pause later, so the pause is in no latency.
    for outcome, following in zip(outcomes, starts[1:], strict=False):
        assert following - outcome.sent_at >= outcome.latency_s + pause
        assert outcome.latency_s >= 0.01


def test_an_unpaced_closed_loop_sends_again_at_once_and_counts_errors():
    calls = itertools.count()  # shared by both workers; next() on it is atomic

    def call(_worker: int) -> None:
        if next(calls) % 2:
            raise RuntimeError("odd request refused")

    tally = load.ClosedLoop(call, 2, "unpaced").run(0.1)
    assert tally.sent == tally.ok + sum(tally.errors.values())
    assert tally.errors == {"other: odd request refused": tally.sent - tally.ok}
    assert abs(tally.ok - (tally.sent - tally.ok)) <= 2  # one of two refused, two workers
