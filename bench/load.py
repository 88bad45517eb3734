"""Bounded load senders that count every request, and what a server process tree holds.

Shared by the contention benchmark (``bench.contention``), the overload benchmark
(``bench.overload``) and the fault tests. Every sender stops by itself: a closed loop
after its duration, an open loop after its last scheduled request plus a drain deadline. Each
request ends as exactly one :class:`Outcome` (success, error with Triton's message, or hung:
no answer by the deadline), so a caller can check ``sent == answered``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from processes.managed import argv, children
from server.stubs import stub_model

# Triton 2.51's messages for requests its dynamic batcher refuses (queue policy).
QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"


@dataclass
class Outcome:
    """One request: when it left (monotonic s), how long its answer took, and any error."""

    sent_at: float
    latency_s: float | None = None  # None: no answer (hung)
    error: str | None = None
    kind: str = ""  # which stream of a mixed load it belongs to

    @property
    def ok(self) -> bool:
        """Answered with a result."""
        return self.latency_s is not None and self.error is None


@dataclass
class Tally:
    """Counts and latency percentiles of a list of outcomes (latencies in ms)."""

    sent: int
    ok: int
    errors: dict[str, int]  # error class (see ``classify_error``) -> count
    hung: int
    seconds: float
    ok_ms: dict[str, float] = field(default_factory=dict)  # p50/p99/max of successes
    error_ms: dict[str, float] = field(default_factory=dict)  # p50/p99/max of errors

    @property
    def answered(self) -> int:
        """Requests that got an answer of any kind."""
        return self.ok + sum(self.errors.values())

    @property
    def throughput(self) -> float:
        """Successful requests per second over the run."""
        return self.ok / self.seconds if self.seconds else 0.0


def classify_error(message: str) -> str:
    """``queue-full``, ``queue-timeout`` or ``other: <first 80 characters>``."""
    if QUEUE_FULL in message:
        return "queue-full"
    if QUEUE_TIMEOUT in message:
        return "queue-timeout"
    return "other: " + message[:80]


def percentiles(values_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max in milliseconds (empty dict for no values)."""
    if not values_s:
        return {}
    ms = np.asarray(values_s) * 1000
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
    }


def tally(outcomes: Sequence[Outcome], seconds: float) -> Tally:
    """Summarize outcomes; ``seconds`` is the load's duration (for throughput)."""
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.error is not None:
            key = classify_error(o.error)
            errors[key] = errors.get(key, 0) + 1
    return Tally(
        sent=len(outcomes),
        ok=sum(o.ok for o in outcomes),
        errors=errors,
        hung=sum(o.latency_s is None for o in outcomes),
        seconds=seconds,
        ok_ms=percentiles([o.latency_s for o in outcomes if o.ok]),
        error_ms=percentiles(
            [o.latency_s for o in outcomes if o.error is not None and o.latency_s is not None]
        ),
    )


def _message(exc: BaseException) -> str:
    return exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)


class ClosedLoop:
    """``concurrency`` threads, each sending one request after the other until stopped.

    Args:
        call: sends one request and returns when it is answered; raising counts as an error.
            Called with the worker index; each worker should use its own client.
        concurrency: worker threads.
        kind: label stored in each outcome.
        pause_s: each worker waits this long after an answer before its next request (a
            paced client); the pause is not part of any latency.
    """

    def __init__(
        self,
        call: Callable[[int], object],
        concurrency: int,
        kind: str = "",
        pause_s: float = 0.0,
    ):
        self.call = call
        self.concurrency = concurrency
        self.kind = kind
        self.pause_s = pause_s
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.started = self.stopped = 0.0

    def _work(self, index: int) -> None:
        while not self._stop.is_set():
            outcome = Outcome(time.monotonic(), kind=self.kind)
            try:
                self.call(index)
            except Exception as exc:  # noqa: BLE001 - every failure is an outcome to count
                outcome.error = _message(exc)
            outcome.latency_s = time.monotonic() - outcome.sent_at
            with self._lock:
                self.outcomes.append(outcome)
            if self.pause_s:
                self._stop.wait(self.pause_s)

    def start(self) -> ClosedLoop:
        """Start the workers."""
        self.started = time.monotonic()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True)
            for i in range(self.concurrency)
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 30.0) -> Tally:
        """Stop after the requests in flight; a worker still stuck after ``timeout`` is hung.

        Raises:
            TimeoutError: a worker did not return (its request hung).
        """
        self._stop.set()
        self.stopped = time.monotonic()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(t.is_alive() for t in self._threads)
        if stuck:
            raise TimeoutError(f"{stuck} {self.kind or 'closed-loop'} request(s) hung")
        return tally(self.outcomes, self.stopped - self.started)

    def run(self, seconds: float) -> Tally:
        """Start, load for ``seconds``, stop."""
        self.start()
        time.sleep(seconds)
        return self.stop()


def open_loop(
    submit: Callable[[int, Callable[[BaseException | None], None]], None],
    rate: float,
    seconds: float,
    drain_s: float,
    kind: str = "",
) -> tuple[list[Outcome], float]:
    """Fire requests at fixed intervals whatever the server does, then wait for every answer.

    Args:
        submit: starts request ``i`` without waiting (e.g. tritonclient gRPC ``async_infer``)
            and arranges for ``done(error_or_None)`` to be called once it is answered.
        rate: requests per second.
        seconds: how long to send.
        drain_s: how long after the last send to wait for answers; what is still unanswered
            then is hung (its latency stays None).
        kind: label stored in each outcome.

    Returns:
        (outcomes in send order, the offered rate actually achieved in requests/s).
    """
    total = max(1, round(rate * seconds))
    outcomes = [Outcome(0.0, kind=kind) for _ in range(total)]
    pending = threading.Semaphore(0)
    start = time.monotonic()
    for i in range(total):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        outcome = outcomes[i]
        outcome.sent_at = time.monotonic()

        def done(error: BaseException | None, outcome: Outcome = outcome) -> None:
            # First answer wins: a callback must not count twice.
            if outcome.latency_s is None:
                outcome.latency_s = time.monotonic() - outcome.sent_at
                outcome.error = None if error is None else _message(error)
                pending.release()

        try:
            submit(i, done)
        except Exception as exc:  # noqa: BLE001 - a send that fails at once is an answer too
            done(exc)
    sent_for = time.monotonic() - start
    deadline = time.monotonic() + drain_s
    for _ in range(total):
        if not pending.acquire(timeout=max(0.0, deadline - time.monotonic())):
            break
    return outcomes, total / sent_for if sent_for > 0 else math.inf


def grpc_submitter(
    client, model: str, make_inputs: Callable[[int], list], outputs=None, **options
) -> Callable[[int, Callable[[BaseException | None], None]], None]:
    """A ``submit`` for :func:`open_loop` over one tritonclient gRPC client (``async_infer``).

    ``options`` go to ``async_infer`` (``client_timeout``, ``priority``, ``timeout``).
    """

    def submit(i: int, done: Callable[[BaseException | None], None]) -> None:
        client.async_infer(
            model,
            make_inputs(i),
            callback=lambda result, error: done(error),
            outputs=outputs,
            **options,
        )

    return submit


# Processes -----------------------------------------------------------------------------------
def label(pid: int) -> str:
    """``tokenize/1`` for a stub, else the program's file name (``tritonserver``)."""
    served = stub_model(pid)
    if served is not None:
        return "/".join(served)
    args = argv(pid)
    return Path(args[0]).name if args else f"pid {pid}"


@dataclass(frozen=True)
class Footprint:
    """Resident memory and open file descriptors of a server and its stubs."""

    rss_mb: dict[int, float]  # pid -> MiB
    fds: dict[int, int]  # pid -> open descriptors

    @property
    def total_rss_mb(self) -> float:
        """RSS of the whole tree."""
        return sum(self.rss_mb.values())

    @property
    def total_fds(self) -> int:
        """Open descriptors of the whole tree."""
        return sum(self.fds.values())


def footprint(pids: Iterable[int]) -> Footprint:
    """Resident memory and open descriptors of each live process in ``pids``."""
    rss, fds = {}, {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                rss[pid] = process.memory_info().rss / (1 << 20)
                fds[pid] = process.num_fds()
        except psutil.Error:  # gone meanwhile, or not ours to read
            rss.pop(pid, None)
    return Footprint(rss, fds)


def tree_footprint(server_pid: int) -> Footprint:
    """Footprint of tritonserver and every process under it."""
    return footprint([server_pid, *children(server_pid)])
