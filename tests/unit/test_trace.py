"""Triton's trace files read into per-step paths, and the report's step-by-step section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.harness import trace
from bench.harness.raw import STAGES, STEP_STAGES
from bench.report import attribution
from pipelines import classification

STEPS = (classification.PREPROCESS, classification.CLASSIFIER, classification.POSTPROCESS)
# Per step: REQUEST_START → QUEUE_START → COMPUTE_START → COMPUTE_INPUT_END →
# COMPUTE_OUTPUT_START, then the next step starts; its COMPUTE_END and REQUEST_END come later
# (a step's release is off the request's path), as Triton 2.51 records them.
STEP_MS = {
    classification.PREPROCESS: 2.0,
    classification.CLASSIFIER: 6.0,
    classification.POSTPROCESS: 0.5,
}


def entries(trace_id: int, start_ms: float, protocol: str = "grpc", complete: bool = True):
    """One ensemble request's trace entries, in the shape Triton writes them."""
    ms = lambda t: int((start_ms + t) * 1e6)  # noqa: E731
    read = "GRPC_WAITREAD_END" if protocol == "grpc" else "HTTP_RECV_START"
    send = ("GRPC_SEND_START", "GRPC_SEND_END")
    if protocol == "http":
        send = ("HTTP_SEND_START", "HTTP_SEND_END")
    out = [{"id": trace_id, "model_name": classification.ENSEMBLE, "model_version": 1}]
    moments = {read: ms(0), "REQUEST_START": ms(0.05), "QUEUE_START": ms(0.06)}
    t = 0.1
    for n, step in enumerate(STEPS):
        child = trace_id * 10 + n + 1
        out.append({"id": child, "model_name": step, "model_version": 1, "parent_id": trace_id})
        step_moments = {
            "REQUEST_START": t,
            "QUEUE_START": t + 0.01,
            "COMPUTE_START": t + 0.1,
            "COMPUTE_INPUT_END": t + 0.15,
            "COMPUTE_OUTPUT_START": t + 0.15 + STEP_MS[step],
        }
        t = step_moments["COMPUTE_OUTPUT_START"] + 0.05
        step_moments |= {"COMPUTE_END": t + 0.3, "REQUEST_END": t + 0.31}
        out += [
            {"id": child, "timestamps": [{"name": k, "ns": ms(v)}]} for k, v in step_moments.items()
        ]
    moments |= {"INFER_RESPONSE_COMPLETE": ms(t + 0.02), send[0]: ms(t + 0.03)}
    if complete:
        moments[send[1]] = ms(t + 0.3)
    out += [{"id": trace_id, "timestamps": [{"name": k, "ns": v}]} for k, v in moments.items()]
    return out, ms(0), ms(t + 0.3)


def write(path: Path, *requests) -> None:
    path.write_text(json.dumps([e for r in requests for e in r[0]]))


def test_a_request_is_laid_out_along_its_path_and_the_segments_add_up(tmp_path):
    first, second = entries(1, 1000.0), entries(2, 2000.0)
    write(tmp_path / "trace-1.json.0", first)
    write(tmp_path / "trace-1.json.1", second, entries(3, 3000.0, complete=False))
    (tmp_path / "trace-2.json.0").write_text('[{"id": 4, "model_na')  # a killed server's file
    traces, problems = trace.read(tmp_path.glob("trace-*"))
    assert [t.id for t in traces] == [1, 2, 3] and [s.model for s in traces[0].steps] == list(STEPS)
    assert len(problems) == 1 and "trace-2.json.0" in problems[0]

    path = trace.critical_path(traces[0])
    assert sum(ns for _, _, ns in path) == first[2] - first[1]  # exactly the server's span
    names = [name for name, _, _ in path]
    assert names[:3] == ["front end: read → core", "ensemble → preprocess", "preprocess: queue"]
    assert "classifier: output → postprocess" in names and names[-1] == "send"
    computes = {name: ns / 1e6 for name, kind, ns in path if kind == trace.COMPUTE}
    assert computes == pytest.approx({f"{s}: compute": STEP_MS[s] for s in STEPS})
    assert trace.critical_path(traces[2]) is None  # no SEND_END: not complete

    # Only the complete requests of the model inside the window count.
    assert [t.id for t in trace.within(traces, classification.ENSEMBLE, first[1], second[2])] == [
        1,
        2,
    ]
    assert trace.within(traces, classification.CLASSIFIER, first[1], second[2]) == []
    result = trace.breakdown(trace.within(traces, classification.ENSEMBLE, 0, 10**15), skip=0)
    assert result.requests == 2
    assert result.total_ms == pytest.approx((first[2] - first[1]) / 1e6)
    assert result.get("classifier: compute") == pytest.approx(6.0)
    assert trace.Breakdown.from_json(result.to_json()) == result


def test_an_http_request_runs_from_its_read_to_the_end_of_its_send(tmp_path):
    request = entries(1, 50.0, "http")
    write(tmp_path / "trace-1.json.0", request)
    (traced,), _ = trace.read([tmp_path / "trace-1.json.0"])
    path = trace.critical_path(traced)
    assert sum(ns for _, _, ns in path) == request[2] - request[1]


def test_the_gap_at_concurrency_one_is_split_into_causes_that_add_up(tmp_path):
    folder = tmp_path / trace.FOLDER
    folder.mkdir()
    requests = [entries(i, 100.0 + 20 * i) for i in range(1, 21)]
    write(folder / "trace-1.json.0", *requests)
    stages = {name: 1.0 for name in STAGES}  # 5 ms of raw pipeline
    later = {name: 1.2 for name in STAGES}  # 1 ms slower after the case: more than 0.5 ms
    window = {"window_start_ns": requests[0][1], "window_end_ns": requests[-1][2]}
    row = {
        "round": 1, "system": "triton", "model": classification.ENSEMBLE, "protocol": "grpc",
        "payload": "binary", "mode": "concurrency", "level": 1.0, "calls": "sync",
        "dataset": "samples", "throughput": 80.0,
    }  # fmt: skip
    client_ms = 12.0
    rows = [
        {**row, "variant": trace.VARIANT, "avg_ms": client_ms, **window,
         "raw_stage_ms": json.dumps({"before": stages, "after": later})},
        {**row, "variant": "batching", "avg_ms": 11.5, "window_start_ns": "", "raw_stage_ms": "",
         "cpu_ms_per_item": ""},
    ]  # fmt: skip
    found, problems = attribution.breakdowns(rows, tmp_path)
    assert problems == [] and len(found) == 1
    grpc = attribution.concurrency_one(rows, found, classification.ENSEMBLE)["grpc"]
    # Each of the five stages took 1.0 ms before the case and 1.2 ms after: 1.1 ms on average,
    # 5.5 ms for the pipeline; the client's 12 ms leave a gap of 6.5 ms to explain.
    assert len(STAGES) == 5
    assert grpc["figures"]["raw pipeline, one image (its stages)"] == pytest.approx(5.5)
    assert grpc["figures"]["gap: client mean, traced − raw pipeline"] == pytest.approx(6.5)
    assert sum(grpc["causes"].values()) == pytest.approx(6.5)
    # The classifier step computes for 6 ms around its one raw stage (the model, 1.1 ms).
    assert STEP_STAGES[classification.CLASSIFIER] == ("model",)
    beyond = grpc["causes"]["classifier: compute beyond its raw functions"]
    assert beyond == pytest.approx(4.9)
    assert grpc["figures"]["client mean, untraced (same round)"] == 11.5

    text = "\n".join(attribution.section(rows, {}, found, problems))
    assert "| classifier: compute | 6.00 | 1.10 |" in text
    assert "moved by 1.00 ms between its two timings" in text  # the drift is said
    plot = attribution.plot(tmp_path, rows, {}, found)
    assert plot is not None and plot.stat().st_size > 10_000


def test_each_servers_traces_are_read_apart_though_their_ids_repeat(tmp_path):
    # Every server numbers its traces from 1: a run's second server writes ids the first used.
    first, second = entries(1, 1000.0), entries(1, 5000.0, "http")
    write(tmp_path / "trace-1.json.0", first)
    write(tmp_path / "trace-6.json.0", second)
    traces, problems = trace.read(tmp_path.glob("trace-*"))
    assert problems == [] and len(traces) == 2
    for traced, (_, start, end) in zip(traces, (first, second), strict=True):
        assert len(traced.steps) == 3
        assert sum(ns for _, _, ns in trace.critical_path(traced)) == end - start
