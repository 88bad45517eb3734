"""The asyncio micro-batcher: requests queue rows, one task runs one model call per batch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.peers.microbatcher.models import Padded
from bench.peers.microbatcher.stats import ModelStats, Timing
from pipelines.rows import split_rows

log = logging.getLogger(__name__)


# The micro-batcher ------------------------------------------------------------------------
@dataclass
class _Pending:
    data: np.ndarray | list  # the request's rows
    future: asyncio.Future
    enqueued_ns: int


@dataclass(frozen=True)
class _Execution:
    outputs: list[np.ndarray | Exception]  # one per request, in order
    input_ns: int
    infer_ns: int
    tokens: int = 0
    padded: int = 0


def _unpack(result: np.ndarray | Padded) -> tuple[np.ndarray, int, int]:
    if isinstance(result, Padded):
        return result.outputs, result.tokens, result.padded
    return result, 0, 0


def _join(parts: list) -> np.ndarray | list:
    """One batch of several requests' rows: arrays are concatenated, lists (texts) chained."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    return [row for part in parts for row in part]


def _log_crash(task: asyncio.Task) -> None:
    # Without this a crashed batcher would only show up as requests that never finish.
    if not task.cancelled() and task.exception() is not None:
        log.error("the micro-batcher stopped", exc_info=task.exception())


class MicroBatcher:
    """Collects concurrent requests into one model run in a worker thread.

    ``run_batch`` maps a batch of rows (an array [rows, ...], or a list of rows such as texts)
    to [rows, ...] outputs, or to ``Padded`` outputs with their token counts; it is called in a
    single dedicated thread, one batch at a time. While it runs, new requests queue up and form
    the next batch, so under load batches fill without waiting.
    """

    def __init__(
        self,
        run_batch: Callable[[Any], np.ndarray],
        max_batch: int = 32,
        max_wait_ms: float = 2.0,
        stats: ModelStats | None = None,
    ):
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_ms >= 0")
        self.run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.stats = stats or ModelStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._carry: _Pending | None = None  # did not fit into the previous batch
        self._current: list[_Pending] = []  # being collected or run: failed if we are stopped
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Start the collecting task on the running event loop."""
        # The queue binds to the loop that first waits on it, so each start gets a fresh one.
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="peer-model")
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="micro-batcher")
        self._task.add_done_callback(_log_crash)

    async def close(self) -> None:
        """Stop collecting; requests still queued fail with RuntimeError."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        leftovers = self._current + ([self._carry] if self._carry else [])
        while self._queue is not None and not self._queue.empty():
            leftovers.append(self._queue.get_nowait())
        for item in leftovers:
            if not item.future.done():
                item.future.set_exception(RuntimeError("the server is shutting down"))
        self._carry, self._current = None, []
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def submit(self, data: np.ndarray | list) -> np.ndarray:
        """Queue ``data`` (rows <= max_batch: an array [rows, ...] or a list) for its outputs."""
        return (await self.submit_timed(data))[0]

    async def submit_timed(self, data: np.ndarray | list) -> tuple[np.ndarray, Timing]:
        """Like submit(), and say where the time went."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(data, future, time.perf_counter_ns()))
        return await future

    async def _collect(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        first, self._carry = self._carry or await self._queue.get(), None
        batch, rows = [first], len(first.data)
        self._current = batch
        deadline = loop.time() + self.max_wait
        while rows < self.max_batch:
            try:
                # Whatever queued up while the previous batch ran is taken without waiting.
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            if rows + len(item.data) > self.max_batch:
                self._carry = item  # first in line for the next batch: order is kept
                break
            batch.append(item)
            rows += len(item.data)
        return batch

    def _execute(self, arrays: list[np.ndarray | list]) -> _Execution:
        """In the worker thread: join, run once, split; isolate a failing request."""
        start = time.perf_counter_ns()
        batch = _join(arrays)
        ready = time.perf_counter_ns()
        try:
            result, tokens, padded = _unpack(self.run_batch(batch))
            done = time.perf_counter_ns()
            # Row slices of a C-contiguous array are contiguous views: no copies. A result
            # without one row per input row fails (RowCountError) rather than being misdealt.
            outputs: list = split_rows(result, [len(a) for a in arrays])
            return _Execution(outputs, ready - start, done - ready, tokens, padded)
        except Exception as exc:
            if len(arrays) == 1:
                return _Execution([exc], ready - start, time.perf_counter_ns() - ready)
            # Retried one by one below, so that only the culprit fails.
            log.exception("batched run of %d requests failed; retrying one by one", len(arrays))
        outputs, tokens, padded = [], 0, 0
        for part in arrays:
            try:
                output, n, m = _unpack(self.run_batch(part))
                outputs.append(split_rows(output, [len(part)])[0])
                tokens, padded = tokens + n, padded + m
            except Exception as exc:  # noqa: BLE001 - reported to its own request only
                outputs.append(exc)
        return _Execution(outputs, ready - start, time.perf_counter_ns() - ready, tokens, padded)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Requests whose client went away are not run.
            batch = [p for p in await self._collect() if not p.future.done()]
            self._current = batch
            if not batch:
                continue
            started = time.perf_counter_ns()
            try:
                execution = await loop.run_in_executor(
                    self._executor, self._execute, [p.data for p in batch]
                )
            except Exception as exc:  # noqa: BLE001 - the executor itself failed
                execution = _Execution([exc] * len(batch), 0, 0)
            rows = sum(len(p.data) for p in batch)
            self.stats.record_execution(rows, execution.input_ns, execution.infer_ns)
            self.stats.record_tokens(execution.tokens, execution.padded)
            for item, output in zip(batch, execution.outputs, strict=True):
                if item.future.done():
                    continue
                if isinstance(output, Exception):
                    item.future.set_exception(output)
                else:
                    timing = Timing(
                        started - item.enqueued_ns, execution.input_ns, execution.infer_ns
                    )
                    item.future.set_result((output, timing))
            self._current = []
