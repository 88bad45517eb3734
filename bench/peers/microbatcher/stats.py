"""Server-side statistics in Triton's /stats shape, so perf_analyzer can report them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bench.peers.microbatcher.models import MODEL_NAME, MODEL_VERSION


# Server-side statistics (Triton's /stats shape, so perf_analyzer can report them) ----------
@dataclass
class Duration:
    """A count and the nanoseconds it took, as in Triton's statistics."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """Account ``count`` events that took ``ns`` in total."""
        self.count += count
        self.ns += ns

    def as_json(self) -> dict[str, int]:
        """``{"count": ..., "ns": ...}``."""
        return {"count": self.count, "ns": self.ns}


@dataclass(frozen=True)
class Timing:
    """Where one request's time went inside the batcher."""

    queue_ns: int = 0  # waiting for its batch to start
    input_ns: int = 0  # its batch's concatenation
    infer_ns: int = 0  # its batch's model run


@dataclass
class ModelStats:
    """Per-model statistics, updated on the event loop only (so no locking).

    A request's counters are all updated together when it completes: perf_analyzer compares
    the differences of two snapshots and aborts if the compute counts disagree.
    """

    model_name: str = MODEL_NAME
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0  # batch rows served
    execution_count: int = 0  # model runs (fewer than requests when batching works)
    last_inference_ms: int = 0
    batches: dict[int, tuple[Duration, Duration, Duration]] = field(default_factory=dict)
    tokens: int = 0  # real word pieces of the texts run (text models only)
    padded_tokens: int = 0  # positions the encoder ran for them, padding included

    def record_execution(self, rows: int, input_ns: int, infer_ns: int) -> None:
        """One model run over a batch of ``rows`` rows."""
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        per_size = self.batches.setdefault(rows, (Duration(), Duration(), Duration()))
        per_size[0].add(input_ns)
        per_size[1].add(infer_ns)

    def record_tokens(self, tokens: int, padded: int) -> None:
        """The real and padded token positions of one model run (0, 0 for images)."""
        self.tokens += tokens
        self.padded_tokens += padded

    def record_request(self, rows: int, timing: Timing, output_ns: int, total_ns: int) -> None:
        """One request answered successfully, ``total_ns`` after its handler started."""
        self.inference_count += rows
        self.success.add(total_ns)
        self.queue.add(timing.queue_ns)
        # Like Triton, every request of a batch is charged its whole batch's compute time.
        self.compute_input.add(timing.input_ns)
        self.compute_infer.add(timing.infer_ns)
        self.compute_output.add(output_ns)

    def as_json(self) -> dict:
        """One entry of Triton's ``model_stats`` list."""
        return {
            "name": self.model_name,
            "version": MODEL_VERSION,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                "cache_hit": Duration().as_json(),
                "cache_miss": Duration().as_json(),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": d[0].as_json(),
                    "compute_infer": d[1].as_json(),
                    "compute_output": d[2].as_json(),
                }
                for size, d in sorted(self.batches.items())
            ],
            "memory_usage": [],
            # Not in Triton's shape (perf_analyzer reads only the fields above): Triton counts
            # these as pipeline_tokens_total and pipeline_padded_tokens_total on /metrics.
            "token_stats": {"tokens": self.tokens, "padded_tokens": self.padded_tokens},
        }
