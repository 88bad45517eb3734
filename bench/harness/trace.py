"""Where a request's time goes inside tritonserver, read from Triton's own trace.

Triton's trace (``--trace-config triton,...``, level TIMESTAMPS) records for every traced request
the moment its front end had read it (GRPC_WAITREAD_END, HTTP_RECV_START), the moments the core
started, queued, computed and answered it (REQUEST_START, QUEUE_START, COMPUTE_START,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, INFER_RESPONSE_COMPLETE) and the send of its
response (GRPC_SEND_* / HTTP_SEND_*). An ensemble adds one such trace per step, tied to it by
``parent_id``. The moments come from the monotonic clock (Triton's ``steady_clock``, Python's
``time.monotonic_ns``), so a benchmark picks the requests of one measurement by the window of
time it ran in.

``critical_path`` lays one request out as consecutive segments, each from one moment on its way
through the server to the next: the front end up to the ensemble, each step's queue, input,
compute and output up to the moment the next step's request starts (a step's own release comes
later, off the path), and the response's send. They add up, exactly, to the time the server held
the request.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# A benchmark's traced cases: the repository's configs with every request traced, a variant of
# their own so that tracing's cost never enters the other cases' figures; their trace files go
# in this folder of the run's results.
VARIANT = "traced"
FOLDER = "traces"
# Segment kinds, in the order a request meets them (the plot's colours follow it).
FRONT_END, SCHEDULE, QUEUE, INPUT, COMPUTE, OUTPUT, SEND = (
    "front end",
    "scheduling",
    "queue",
    "input",
    "compute",
    "output",
    "send",
)
KINDS = (FRONT_END, SCHEDULE, QUEUE, INPUT, COMPUTE, OUTPUT, SEND)
# Where the front end had the request in hand: gRPC's WAITREAD_START is when it began waiting
# for the next message (at concurrency 1, mostly the client's think time), so its END is used.
READ_DONE = ("GRPC_WAITREAD_END", "HTTP_RECV_START")
SEND_START = ("GRPC_SEND_START", "HTTP_SEND_START")
SEND_END = ("GRPC_SEND_END", "HTTP_SEND_END")
# Trace files the server writes for one run: <file>.<n> every LOG_FREQUENCY traces, the rest at
# exit. Kept modest so a long run does not hold every trace in the server's memory.
LOG_FREQUENCY = 500


def server_args(trace_file: Path) -> list[str]:
    """Options for tritonserver: tracing possible, and off until a model's setting turns it on."""
    return [
        f"--trace-config=triton,file={trace_file}",
        f"--trace-config=triton,log-frequency={LOG_FREQUENCY}",
        "--trace-config=level=OFF",
    ]


def set_tracing(client, model: str, on: bool, headers: dict | None = None) -> None:
    """Trace every request of ``model`` (and of its steps, for an ensemble), or none.

    Args:
        client: a ``tritonclient.http`` client of the server.
        model: the model whose requests to trace.
        on: trace every request from now on (True), or stop (False).
        headers: the admin key's header (trace settings are a restricted API here).
    """
    settings = {"trace_level": ["TIMESTAMPS" if on else "OFF"], "trace_rate": "1"}
    if on:
        settings["trace_count"] = "-1"
        settings["log_frequency"] = str(LOG_FREQUENCY)
    client.update_trace_settings(model, settings, headers=headers)


@dataclass
class Trace:
    """One traced request: its model, its moments (name → ns) and, for an ensemble, its steps."""

    id: int
    model: str
    parent: int | None
    moments: dict[str, int] = field(default_factory=dict)
    steps: list[Trace] = field(default_factory=list)

    def first(self, names: Sequence[str]) -> int | None:
        """The first of ``names`` this trace has (the protocols name the same moment apart)."""
        return next((self.moments[n] for n in names if n in self.moments), None)


def read(paths: Iterable[Path]) -> tuple[list[Trace], list[str]]:
    """Top-level traces (steps attached, in the order they ran) from trace files.

    Each server numbers its traces from 1: the files of one server (``<file>.<n>``, named by the
    ``--trace-config`` file it was given) are read together, apart from every other server's.

    Returns:
        (traces, problems): a file that does not parse (a server killed while writing it) is
        left out and named in ``problems``.
    """
    by_id: dict[tuple[str, int], Trace] = {}
    problems = []
    for path in sorted(map(Path, paths)):
        server = path.name.rsplit(".", 1)[0] if path.suffix[1:].isdigit() else path.name
        try:
            entries = json.loads(path.read_text() or "[]")
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        for entry in entries:
            key = (server, entry["id"])
            trace = by_id.get(key)
            if trace is None:
                trace = by_id[key] = Trace(entry["id"], "", None)
            if "model_name" in entry:
                trace.model = entry["model_name"]
                trace.parent = entry.get("parent_id") or None
            for moment in entry.get("timestamps", []):
                trace.moments[moment["name"]] = int(moment["ns"])
    top = []
    for (server, _), trace in by_id.items():
        parent = by_id.get((server, trace.parent)) if trace.parent else None
        if parent is not None:
            parent.steps.append(trace)
        elif trace.parent is None:
            top.append(trace)
    for trace in top:
        trace.steps.sort(key=lambda s: s.moments.get("REQUEST_START", 0))
    return sorted(top, key=lambda t: t.moments.get("REQUEST_START", 0)), problems


def within(traces: Iterable[Trace], model: str, start_ns: int, end_ns: int) -> list[Trace]:
    """The complete traces of ``model`` whose request started inside [start_ns, end_ns]."""
    return [
        t
        for t in traces
        if t.model == model
        and start_ns <= t.moments.get("REQUEST_START", -1) <= end_ns
        and critical_path(t) is not None
    ]


def critical_path(trace: Trace) -> list[tuple[str, str, int]] | None:
    """(segment, kind, ns) from the front end's read to the end of the response's send.

    None for a trace that misses a moment on the way (a failed request, a truncated file).
    """
    marks: list[tuple[int, str, str]] = []  # (moment, segment that starts there, its kind)
    read_done = trace.first(READ_DONE)
    if read_done is None:
        return None
    steps = trace.steps or [trace]
    marks.append((read_done, "front end: read → core", FRONT_END))
    if trace.steps:
        marks.append((trace.moments.get("REQUEST_START"), f"ensemble → {steps[0].model}", SCHEDULE))
    for i, step in enumerate(steps):
        after = steps[i + 1].model if i + 1 < len(steps) else "response"
        m = step.moments
        marks += [
            (m.get("REQUEST_START"), f"{step.model}: queue", QUEUE),
            (m.get("COMPUTE_START"), f"{step.model}: input", INPUT),
            (m.get("COMPUTE_INPUT_END"), f"{step.model}: compute", COMPUTE),
            (m.get("COMPUTE_OUTPUT_START"), f"{step.model}: output → {after}", OUTPUT),
        ]
    # The ensemble's (or model's) response is complete, then the front end sends it.
    done = trace.moments.get("INFER_RESPONSE_COMPLETE") or trace.first(SEND_START)
    marks += [(done, "front end: response → send", SEND), (trace.first(SEND_START), "send", SEND)]
    end = trace.first(SEND_END)
    if end is None or any(moment is None for moment, _, _ in marks):
        return None
    moments = [moment for moment, _, _ in marks] + [end]
    return [
        (name, kind, max(0, moments[i + 1] - moment))
        for i, (moment, name, kind) in enumerate(marks)
    ]


def release_tail(trace: Trace) -> int | None:
    """How long after the end of the response's send its steps were still being released (ns).

    A step's request is released after the next step has started (its output phase ends off
    the path): that work still takes the core, after the client already has its answer.
    """
    end = trace.first(SEND_END)
    released = [s.moments.get("REQUEST_END") for s in trace.steps or [trace]]
    if end is None or None in released:
        return None
    return max(0, max(released) - end)


@dataclass(frozen=True)
class Breakdown:
    """Mean time per segment over many requests of one measurement, in milliseconds."""

    requests: int
    segments: list[tuple[str, str, float]]  # (segment, kind, mean ms), in path order
    release_ms: float = 0.0  # mean release_tail: steps still being released after the send

    @property
    def total_ms(self) -> float:
        """Mean time the server held a request: the sum of its segments."""
        return sum(ms for _, _, ms in self.segments)

    def by_kind(self) -> dict[str, float]:
        """Mean ms per kind of segment (front end, queue, compute, ...)."""
        out: dict[str, float] = defaultdict(float)
        for _, kind, ms in self.segments:
            out[kind] += ms
        return dict(out)

    def get(self, name: str) -> float:
        """One segment's mean ms (0 if this path has no such segment)."""
        return sum(ms for segment, _, ms in self.segments if segment == name)

    def to_json(self) -> dict:
        """A JSON-friendly form (kept beside a run's results)."""
        return {
            "requests": self.requests,
            "segments": [list(s) for s in self.segments],
            "release_ms": self.release_ms,
        }

    @classmethod
    def from_json(cls, data: dict) -> Breakdown:
        """The inverse of ``to_json``."""
        return cls(data["requests"], [tuple(s) for s in data["segments"]], data["release_ms"])


def breakdown(traces: Sequence[Trace], skip: float = 0.1) -> Breakdown | None:
    """Mean segments over ``traces``, leaving out the first ``skip`` of them (the warm-up).

    Requests whose paths differ in shape (another step order) are left out with the others'
    shape the one most requests had.
    """
    kept = [t for t in traces[int(len(traces) * skip) :] if critical_path(t)]
    if not kept:
        return None
    shapes: dict[tuple, list] = defaultdict(list)
    for t in kept:
        path = critical_path(t)
        shapes[tuple((name, kind) for name, kind, _ in path)].append((path, release_tail(t)))
    shape, members = max(shapes.items(), key=lambda item: len(item[1]))
    segments = [
        (name, kind, statistics.fmean(p[i][2] for p, _ in members) / 1e6)
        for i, (name, kind) in enumerate(shape)
    ]
    tails = [tail for _, tail in members if tail is not None]
    return Breakdown(len(members), segments, statistics.fmean(tails) / 1e6 if tails else 0.0)
