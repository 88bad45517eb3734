"""The perf harness's logic on recorded data: CSV parsing, stats deltas, variants, ratios."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import pytest

from bench.harness import affinity, inputs, perf_analyzer, stats, variants
from bench.harness.plan import (
    MODELS,
    OPENAI_NULL_LEVELS,
    TEXT_MODELS,
    Plan,
    mixed_case,
    padding_step,
    perf_args,
    stats_models,
)
from bench.harness.runner import write_csv
from bench.harness.servers import measure_raw
from bench.report.markdown import _metric_lines, write_markdown
from bench.report.plots import write_plots
from bench.report.points import load
from bench.report.ratios import (
    METRICS,
    TARGETS,
    Metric,
    NotComputable,
    equal_p99_ratio,
    metric_table,
)
from export import text_samples
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding
from tests.helpers import embed_report_row

# Recorded from perf_analyzer 2.51 (-f out.csv --verbose-csv) against the classify ensemble.
RECORDED_CSV = """\
Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,\
Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,\
p90 latency,p95 latency,p99 latency,request/response,response wait
1,143.723,8,0,2,70,6012,902,4,6816,7613,8067,8936,12,6896
4,213.095,19,5499,2,146,11907,1103,8,18220,22791,24152,27978,27,18606
"""


def test_perf_analyzer_csv_is_parsed_into_milliseconds():
    first, second = perf_analyzer.parse_csv(RECORDED_CSV)
    assert first.level == 1 and first.throughput == pytest.approx(143.723)
    assert first.p50_ms == pytest.approx(6.816) and first.p99_ms == pytest.approx(8.936)
    assert first.server_compute_ms == pytest.approx((70 + 6012 + 902) / 1000)
    assert second.level == 4 and second.p95_ms == pytest.approx(24.152)


def test_request_rate_csv_uses_the_rate_column():
    text = RECORDED_CSV.replace("Concurrency,", "Request Rate,").replace("\n1,", "\n50,")
    assert perf_analyzer.parse_csv(text)[0].level == 50


def test_built_commands_drive_perf_analyzer_against_a_real_endpoint(tmp_path):
    """Each kind of command the harness builds, run by the real perf_analyzer against the null
    peer (a KServe v2 HTTP server that answers without a model): every flag is accepted, the
    level comes back as asked, the CSV parses."""
    from bench.peers.microbatcher import PeerServer

    # Zeros: random FP32 data may hold values that JSON cannot carry.
    counted = ["--measurement-mode=count_windows", "--measurement-request-count=10"]
    counted.append("--input-data=zero")
    cases = [
        ("concurrency", 2, "binary", [0]),  # pinned with taskset, binary tensors
        ("concurrency", 1, "json", None),  # the peer's JSON payload
        ("rate", 40.0, "binary", None),  # Poisson arrivals
    ]
    with PeerServer(None, port=0, log_path=tmp_path / "peer.log") as peer:
        for mode, level, payload, cpus in cases:
            run = perf_analyzer.Run(
                classification.CLASSIFIER, peer.url, "http", mode=mode, tensor_format=payload,
                cpus=cpus, measurement_ms=500, stability_percent=1000, extra=counted,
            )  # fmt: skip
            point = perf_analyzer.measure(run, level, timeout=120)
            assert point.level == level and point.throughput > 0 and point.p99_ms > 0, mode
    with pytest.raises(ValueError):
        perf_analyzer.Run("m", "u", mode="bogus").command(Path("o"), 1)


def test_a_watched_level_ends_as_soon_as_its_watch_gives_a_reason(tmp_path):
    """The harness watches its server while a case runs: a hung one costs the watch's own wait,
    not the case's timeout (tests/integration/test_perf_run.py hangs a real tritonserver)."""
    from bench.peers.microbatcher import PeerServer

    asked = []

    def watch():
        asked.append(time.monotonic())
        return None if len(asked) < 2 else "the server hangs"

    with PeerServer(None, port=0, log_path=tmp_path / "peer.log") as peer:
        # One-minute windows: nothing ends this level soon but its watch.
        run = perf_analyzer.Run(
            classification.CLASSIFIER, peer.url, "http", measurement_ms=60_000,
            stability_percent=1000, extra=["--input-data=zero"],
        )  # fmt: skip
        started = time.monotonic()
        with pytest.raises(perf_analyzer.PerfAnalyzerError) as raised:
            perf_analyzer.measure(run, 1, timeout=150, watch=watch)
    assert str(raised.value) == "perf_analyzer stopped: the server hangs"
    assert len(asked) == 2 and asked[-1] - started < 30


def _stats(inferences, executions, batches, success_ns, queue_ns=0, compute_ns=0):
    return {
        "inference_count": inferences,
        "execution_count": executions,
        "inference_stats": {
            "success": {"count": inferences, "ns": success_ns},
            "queue": {"count": inferences, "ns": queue_ns},
            "compute_input": {"count": inferences, "ns": 0},
            "compute_infer": {"count": inferences, "ns": compute_ns},
            "compute_output": {"count": inferences, "ns": 0},
        },
        "batch_stats": [
            {"batch_size": b, "compute_infer": {"count": n}} for b, n in batches.items()
        ],
    }


def test_stats_delta_gives_formed_batches_and_per_request_times():
    before = {"m": _stats(10, 10, {1: 10}, 10_000_000)}
    after = {
        "m": _stats(50, 20, {1: 12, 4: 8}, 90_000_000, queue_ns=4_000_000, compute_ns=40_000_000)
    }
    d = stats.delta(before, after)["m"]
    assert (d.inferences, d.executions) == (40, 10)
    assert d.avg_batch == 4.0
    assert d.batch_histogram == {1: 2, 4: 8}
    assert d.request_ms == pytest.approx(2.0)  # 80 ms over 40 requests
    assert d.queue_ms == pytest.approx(0.1) and d.compute_ms == pytest.approx(1.0)


def test_variants_override_only_what_they_are_about():
    by_name = {v.name: v for v in variants.standard(server_cores=2)}
    base = by_name["batching"].configs(MODEL_REPOSITORY, "local")
    plain = by_name["no-batching"].configs(MODEL_REPOSITORY, "local")
    two = by_name["instances-2"].configs(MODEL_REPOSITORY, "local")
    assert all(c.HasField("dynamic_batching") for c in base.values())
    assert not any(c.HasField("dynamic_batching") for c in plain.values())
    assert (
        plain[classification.CLASSIFIER].max_batch_size
        == base[classification.CLASSIFIER].max_batch_size
    )
    assert [g.count for g in two[classification.CLASSIFIER].instance_group] == [2]
    assert two[classification.CLASSIFIER].parameters["intra_op_thread_count"].string_value == "1"
    assert base[classification.CLASSIFIER].parameters["intra_op_thread_count"].string_value == "2"
    assert "intra_op_thread_count" not in base[classification.PREPROCESS].parameters


def test_cores_are_split_between_server_and_load_generator():
    assert affinity.split(cores=[0, 1]) == ([1], [0])
    assert affinity.split(cores=list(range(16))) == (list(range(4, 16)), [0, 1, 2, 3])
    assert affinity.split(cores=[3]) == ([3], [3])
    # The overload and contention benchmarks: the server on one core, the load on the others.
    assert affinity.split(server_cores=1, cores=[0, 1, 2]) == ([2], [0, 1])


def point(throughput, p99, p50=None):
    return {"throughput": throughput, "p99_ms": p99, "p50_ms": p50 or p99 / 2}


def test_equal_p99_ratio_compares_at_the_peers_budget():
    peer = [point(100, 20), point(150, 60)]
    ours = [point(120, 10), point(300, 50), point(400, 90)]
    # Budget = p99 of the peer's best point (60 ms): we reach 300 within it, the peer 150.
    assert equal_p99_ratio(ours, peer) == pytest.approx(2.0)
    assert equal_p99_ratio([], peer) is None


def test_a_ratio_without_a_point_in_the_budget_is_not_a_number_but_says_why(tmp_path):
    peer = [point(150, 60)]
    assert equal_p99_ratio([point(300, 50)], peer) == pytest.approx(2.0)
    undefined = equal_p99_ratio([point(300, 90), point(100, 61)], peer)
    assert isinstance(undefined, NotComputable)
    assert "within the peer's p99 of 60.0 ms" in undefined and "61.0 ms" in undefined
    metric = Metric("ours ÷ peer", lambda rows, raw: undefined, target=2.0)
    (item,) = metric_table([{"round": 1}], {1: {}}, [metric])
    assert item["values"] == [] and "round 1: no point of ours" in item["why"]
    (line,) = _metric_lines([item])
    assert line.startswith("| ours ÷ peer | n/a: round 1: no point of ours")


def recorded_rows(tmp_path: Path) -> tuple[list[dict], dict]:
    def row(
        r, system, variant, model, level, thr, p50, p99, payload="binary", protocol="grpc", **extra
    ):
        base = {
            "round": r,
            "system": system,
            "variant": variant,
            "model": model,
            "protocol": protocol,
            "payload": payload,
            "mode": "concurrency",
            "level": level,
            "throughput": thr,
            "p50_ms": p50,
            "p90_ms": p99,
            "p95_ms": p99,
            "p99_ms": p99,
            "avg_ms": p50,
            "server_queue_ms": 0,
            "server_compute_ms": 0,
            "error": "",
            "classifier_batch_histogram": "",
        }
        for m in (classification.ENSEMBLE, *variants.STEPS):
            base[f"{m}_avg_batch"] = extra.get(f"{m}_avg_batch", "")
            base[f"{m}_request_ms"] = extra.get(f"{m}_request_ms", "")
        return base

    rows = []
    for r in (1, 2):
        rows += [
            row(r, "triton", "batching", classification.ENSEMBLE, 1, 90, 10.5, 12,
                classify_request_ms=10.0, preprocess_request_ms=3.0, classifier_request_ms=5.5,
                postprocess_request_ms=0.9),
            row(r, "triton", "batching", classification.ENSEMBLE, 16, 133, 120, 130),
            row(r, "triton", "batching", classification.CLASSIFIER, 1, 150, 6.5, 7),
            row(r, "triton", "batching", classification.CLASSIFIER, 16, 190, 80, 90,
                classifier_avg_batch=4),
            row(r, "triton", "no-batching", classification.CLASSIFIER, 16, 150, 100, 110),
            row(r, "triton", "batching", classification.PREPROCESS, 16, 400, 40, 50),
            row(r, "triton", "batching", classification.POSTPROCESS, 16, 5000, 3, 8),
            row(r, "triton", "batching", classification.CLASSIFIER, 16, 60, 260, 300,
                payload="json", protocol="http"),
            row(r, "peer", "-", classification.CLASSIFIER, 16, 30, 500, 600, payload="json",
                protocol="http"),
            row(r, "null-peer", "-", classification.CLASSIFIER, 16, 240, 60, 70, payload="json",
                protocol="http"),
        ]  # fmt: skip
    raw = {r: {"model": {1: 200.0, 4: 210.0, 8: 180.0}, "pipeline": {1: 140.0, 8: 130.0}}
           for r in (1, 2)}  # fmt: skip
    points_csv, raw_csv = write_csv(tmp_path, rows, raw)
    return load(points_csv, raw_csv)


def test_metrics_from_recorded_rounds(tmp_path):
    rows, raw = recorded_rows(tmp_path)
    table = {item["metric"].name: item for item in metric_table(rows, raw)}

    def value(prefix):
        (name,) = [n for n in table if n.startswith(prefix)]
        return table[name]

    assert value("raw model batching gain")["median"] == pytest.approx(210 / 200)
    assert value("served batching gain")["median"] == pytest.approx(190 / 150)
    captured = value("dynamic batching captures")
    assert captured["median"] == pytest.approx(190 / 210) and captured["met"] is True
    saturation = value("classify served ÷ raw pipeline, saturation (grpc)")
    assert saturation["median"] == pytest.approx(133 / 140) and saturation["met"] is True
    c1 = value("classify served ÷ raw pipeline, concurrency 1 (grpc)")
    assert c1["median"] == pytest.approx(90 / 140) and c1["met"] is False
    assert value("ensemble ÷ its slowest stage")["median"] == pytest.approx(133 / 190)
    hop = value("serving overhead per step, end to end")
    assert hop["median"] == pytest.approx((10.5 - 1000 / 140) / 3)
    assert value("Triton ÷ peer (FastAPI")["median"] == pytest.approx(2.0)
    assert value("Triton ÷ peer, same binary")["values"] == []  # no binary peer rows recorded
    assert value("load generator headroom, JSON")["median"] == pytest.approx(4.0)


def test_report_and_plots_are_written(tmp_path):
    rows, raw = recorded_rows(tmp_path)
    plots = write_plots(tmp_path, rows, raw)
    assert all(p.exists() and p.stat().st_size > 10_000 for p in plots)
    md = write_markdown(tmp_path / "report.md", rows, raw, ["method line"], plots)
    text = md.read_text()
    assert text.startswith("# Performance report\n\n## Method\n\n- method line")
    row = "| classify served ÷ raw pipeline, concurrency 1 (grpc) | 0.64x [0.64x – 0.64x] |"
    assert f"{row} ≥ 0.85x | **no** |" in text
    assert "![latency_vs_throughput](latency_vs_throughput.png)" in text


def test_full_plan_is_well_formed():
    plan = Plan.full()
    cases = [c for v in ("batching", "no-batching", "instances-2") for c in plan.triton_cases(v)]
    assert {c.model for c in cases} == {*MODELS, *TEXT_MODELS}
    assert all(
        c.payload == "binary" or c.model in (classification.CLASSIFIER, "embed", "embed_graph")
        for c in cases
    )
    assert set(plan.rate_targets) == {
        (m, p)
        for m in (classification.ENSEMBLE, classification.CLASSIFIER)
        for p in ("grpc", "http")
    }
    peers = 2 * 2 * 6 + 6  # classifier and embed, JSON and binary, and classify: six levels
    nulls = 2 * 2 * 3 + 3  # and the load generator's ceiling for classify's binary images
    # infinity-emb and the FastAPI peer with async calls at its levels, its null twin.
    infinity = 2 * len(plan.infinity_levels) + len(OPENAI_NULL_LEVELS)
    # The FastAPI peer and infinity-emb over the mixed texts (embed's are among the cases).
    mixed = 2 * len(plan.mixed_levels)
    assert plan.size() == (
        len(cases)
        + 5 * 4
        + peers
        + nulls
        + len(plan.cache_levels)
        + infinity
        + mixed
        + len(plan.traced)
    )


def test_raw_engine_measures_every_kind(classifier_onnx, encoder_onnx):
    plan = Plan.short()
    plan.raw_model_batches, plan.raw_pipeline_batches, plan.raw_embed_batches = [1, 2], [1], [1, 4]
    plan.raw_seconds, plan.raw_mixed_batches = 0.05, [4]
    raw = measure_raw([0], threads=1, plan=plan)
    mixed = {f"mixed_{how}{ratio}" for how in ("padded", "sorted") for ratio in ("", "_ratio")}
    assert set(raw) == {"model", "pipeline", "embed", "embed_int8", *mixed}
    assert set(raw["model"]) == {1, 2} and set(raw["embed"]) == {1, 4}
    assert all(v > 0 for curve in raw.values() for v in curve.values())
    # Sorting never pads more than padding the same batch to its longest text.
    assert 1.0 <= raw["mixed_sorted_ratio"][4] <= raw["mixed_padded_ratio"][4]


def test_statistics_of_several_versions_are_summed():
    v1 = _stats(10, 5, {1: 2, 4: 2}, 10_000_000)
    v2 = _stats(6, 6, {1: 6}, 3_000_000)
    merged = stats.merge_versions([v1, v2])
    assert (merged["inference_count"], merged["execution_count"]) == (16, 11)
    assert merged["inference_stats"]["success"] == {"count": 16, "ns": 13_000_000}
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in merged["batch_stats"]} == {
        1: 8,
        4: 2,
    }
    assert stats.merge_versions([v1]) is v1


def test_mixed_texts_are_distinct_sentences_and_passages_and_reproducible():
    texts = text_samples.mixed_texts(2000, seed=7)
    words = [len(t.split()) for t in texts]
    passages = [w for w in words if w >= text_samples.MIXED_PASSAGE_WORDS[0]]
    assert len(texts) == len(set(texts)) == 2000
    assert len(passages) == round(2000 * text_samples.MIXED_PASSAGE_SHARE) == 600
    assert min(passages) >= 80 and max(passages) <= 250
    # The others are one sentence each, and read as English (words of the lists, capitalized).
    singles = [t for t, w in zip(texts, words, strict=True) if w < 80]
    assert all(t.count(".") == 1 and t.endswith(".") and t[0].isupper() for t in singles)
    assert text_samples.mixed_texts(2000, seed=7) == texts
    assert text_samples.mixed_texts(2000, seed=8) != texts
    # What the benchmark sends: one text per request, none twice.
    entries = inputs.text_entries(inputs.mixed_texts())
    assert len({e[embedding.TEXT]["content"][0] for e in entries}) == inputs.MIXED_TEXTS


def test_harness_reads_embeds_steps_from_the_configs_it_serves():
    # The CPU configs: embed is one step, tokenize_encode (v1 fp32, v2 INT8), which pads.
    local = stats_models("local")
    assert embedding.TOKENIZE_ENCODE in local
    assert embedding.TOKENIZE not in local and embedding.ENCODER not in local
    assert padding_step("embed", "local") == (embedding.TOKENIZE_ENCODE, "1")
    assert padding_step("embed_int8", "local") == (embedding.TOKENIZE_ENCODE, "2")
    # local-shed keeps tokenize -> encoder.
    shed = stats_models("local-shed")
    assert {embedding.TOKENIZE, embedding.ENCODER} <= set(
        shed
    ) and embedding.TOKENIZE_ENCODE not in shed
    assert padding_step("embed", "local-shed") == (embedding.TOKENIZE, None)


def test_token_counts_are_read_from_the_metrics_page():
    page = """\
# HELP pipeline_tokens_total Word pieces
# TYPE pipeline_tokens_total counter
pipeline_tokens_total{model="tokenize_encode",version="1"} 1200
pipeline_tokens_total{model="tokenize_encode",version="2"} 50
pipeline_padded_tokens_total{model="tokenize_encode",version="1"} 1500
pipeline_padded_tokens_total{model="tokenize_encode",version="2"} 70
pipeline_padded_tokens_total{model="tokenize",version="1"} 9
nv_inference_count{model="tokenize_encode",version="1"} 3
"""
    assert stats.token_counts(page, embedding.TOKENIZE_ENCODE, "1") == (1200, 1500)
    assert stats.token_counts(page, embedding.TOKENIZE_ENCODE) == (1250, 1570)
    assert stats.token_counts(page, "encoder") == (0, 0)


def test_plans_measure_every_server_on_mixed_lengths():
    for plan in (Plan.short(), Plan.embed_peers()):
        assert plan.mixed_levels == [8, 32] and plan.raw_mixed_batches
        mixed = [c for c in plan.triton_cases("batching") if c.dataset == "mixed"]
        assert [(c.model, c.payload, c.calls, c.level) for c in mixed] == [
            ("embed", "json", "async", 8),
            ("embed", "json", "async", 32),
        ]
        assert "[mixed]" in mixed[0].label()
    assert mixed_case("infinity", 8).payload == "openai"
    # Windows count requests: a server padding passages may answer none within a second.
    assert "--measurement-mode=count_windows" in perf_args(mixed[1])
    assert "--measurement-request-count=128" in perf_args(mixed[1])
    infinity = perf_args(mixed_case("infinity", 8))
    assert "--service-kind=openai" in infinity and "--measurement-request-count=64" in infinity
    only = Plan.mixed()
    assert {c.dataset for c in only.triton_cases("batching")} == {"mixed"}
    assert only.size() == 3 * 2 + len(OPENAI_NULL_LEVELS)


def _embed_rows(r: int, mixed_padding: float) -> list[dict]:
    """One round of an embed-peers run, asynchronous calls: short texts, mixed lengths."""

    def row(system, level, thr, p99, dataset="samples", calls="async", payload="json", **extra):
        fields = {"dataset": dataset, "calls": calls, "payload": payload}
        fields = {"tokens": "", "padded_tokens": "", **fields, **extra}
        return embed_report_row(r, system, level, thr, p99, **fields)

    pad = round(1000 * mixed_padding)
    return [
        row("triton", 1, 100, 10.5),
        row("peer", 1, 100, 10),
        row("triton", 8, 400, 25),
        row("peer", 8, 380, 24),
        row("triton", 32, 500, 100),
        row("peer", 32, 520, 80),  # embed slower, and its p99 1.25x the peer's
        row("triton", 8, 60, 200, "mixed", "async", tokens=1000, padded_tokens=pad,
            tokenize_encode_avg_batch=5.0, encoder_avg_batch=""),
        row("peer", 8, 20, 500, "mixed", "async", tokens=1000, padded_tokens=3500),
        row("infinity", 8, 25, 450, "mixed", "async", payload="openai"),
        row("triton", 32, 70, 600, "mixed", "async", tokens=1000, padded_tokens=pad),
        row("peer", 32, 40, 900, "mixed", "async", tokens=1000, padded_tokens=3800),
        row("infinity", 32, 30, 1200, "mixed", "async", payload="openai"),
    ]  # fmt: skip


def test_embedding_targets_pass_or_fail_from_ratios_of_the_same_round(tmp_path):
    rows = _embed_rows(1, 1.05) + _embed_rows(2, 1.3)
    raw = {r: {"embed": {1: 120.0, 32: 510.0}, "mixed_sorted": {8: 80.0}} for r in (1, 2)}
    table = {i["metric"].name: i for i in metric_table(rows, raw, TARGETS)}
    assert len(table) == len(TARGETS)

    def check(name, median, met):
        item = table[name]
        assert item["median"] == pytest.approx(median) and item["met"] is met, name

    check("short texts, c=8: embed ÷ FastAPI batcher, texts/s", 400 / 380, True)
    check("short texts, c=32: embed ÷ FastAPI batcher, texts/s", 500 / 520, False)
    check("short texts, c=32: embed p99 ÷ FastAPI batcher p99", 100 / 80, False)
    check("short texts, c=1: embed p99 ÷ FastAPI batcher p99", 10.5 / 10, True)
    check(
        "short texts, saturation: embed ÷ raw engine at its best batch (padded to the longest)",
        500 / 510,
        True,
    )
    check("mixed lengths, c=8: embed ÷ FastAPI peer, texts/s", 3.0, True)
    check("mixed lengths, c=32: embed ÷ FastAPI peer, texts/s", 70 / 40, False)
    check("mixed lengths, c=8: embed ÷ infinity-emb, texts/s", 60 / 25, True)
    check("mixed lengths, c=32: embed p99 ÷ infinity-emb p99", 0.5, True)
    check("mixed lengths, c=8: embed p99 ÷ FastAPI peer p99", 0.4, True)
    # Rounds at 1.05 and 1.3 padded ÷ real: the median 1.175 meets ≤ 1.2.
    check("mixed lengths, c=32: embed padded ÷ real tokens", 1.175, True)
    text = write_markdown(tmp_path / "report.md", rows, raw, [], []).read_text()
    assert "| mixed lengths, c=32: embed ÷ FastAPI peer, texts/s | 1.75x" in text
    assert "| ≥ 2.00x | **no** |" in text
    # The mixed table: each server's padding; infinity-emb's cannot be seen.
    assert "| FastAPI peer | 8 | 20.0 [20.0 – 20.0] | 250.00 [250.00 – 250.00] | 500.00" in text
    assert "| 3.50 [3.50 – 3.50] |" in text
    assert "| infinity-emb | 32 | 30.0 [30.0 – 30.0] | 600.00 [600.00 – 600.00] | " in text
    assert "1200.00 [1200.00 – 1200.00] | not observable |" in text
    assert "| sorted sub-batches | 8 | 80.0 [80.0 – 80.0] | not measured |" in text
    # embed's formed batches are those of the step that batches: tokenize_encode here.
    mixed = [x for x in text.splitlines() if x.startswith("| triton | batching | embed [mixed]")]
    assert [x.endswith("| 5.00 [5.00 – 5.00] |") for x in mixed] == [True, False]  # c=8, c=32


def test_the_tuner_measures_embed_where_it_runs_the_tuned_encoder():
    from tune import search

    # The CPU configs serve embed as tokenize_encode alone; the tuned configs keep the encoder.
    assert not search.serves_tuned_steps("embed", MODEL_REPOSITORY, "local")
    assert search.serves_tuned_steps("embed", MODEL_REPOSITORY, "local-tuned")
    assert search.serves_tuned_steps(classification.ENSEMBLE, MODEL_REPOSITORY, "local")
    assert search.serves_tuned_steps(classification.CLASSIFIER, MODEL_REPOSITORY, "local")


def test_ratios_are_taken_against_the_raw_pipeline_read_beside_each_case():
    def row(system, model, level, thr, p99, ref):
        return {
            "round": 1, "system": system, "variant": "batching" if system == "triton" else "-",
            "model": model, "protocol": "http", "payload": "binary", "mode": "concurrency",
            "level": float(level), "calls": "sync", "dataset": "samples", "throughput": thr,
            "p50_ms": p99 / 2, "p99_ms": p99,
            "raw_reference": json.dumps({"1": ref[0], "4": ref[1]}) if ref else "",
        }  # fmt: skip

    # The machine was 20 % slower while the peer ran: its raw reading says so.
    rows = [
        row("triton", classification.ENSEMBLE, 1, 90.0, 12.0, (100.0, 110.0)),
        row("triton", classification.ENSEMBLE, 8, 100.0, 90.0, (100.0, 110.0)),
        row("peer", classification.ENSEMBLE, 8, 88.0, 100.0, (80.0, 88.0)),
    ]
    raw = {"pipeline": {1: 150.0, 4: 160.0}}  # the round's curve, minutes earlier: not used
    metrics = {m.name: m for m in METRICS}
    table = {name: metrics[name].compute(rows, raw) for name in metrics if "classify " in name}
    assert table["classify served ÷ raw pipeline, concurrency 1 (http)"] == pytest.approx(0.9)
    assert table["classify served ÷ raw pipeline, saturation (http)"] == pytest.approx(100 / 110)
    name = "classify ÷ FastAPI pipeline peer, {} at concurrency 8 (HTTP binary)"
    assert table[name.format("images/s")] == pytest.approx((100 / 110) / (88 / 88))
    assert table[name.format("p99")] == pytest.approx((90 * 110) / (100 * 88))
    # Without readings beside the cases, the round's curve is the reference.
    for r in rows:
        r["raw_reference"] = ""
    table = {name: metrics[name].compute(rows, raw) for name in table}
    assert table["classify served ÷ raw pipeline, concurrency 1 (http)"] == pytest.approx(0.6)
    assert table[name.format("images/s")] == pytest.approx(100 / 88)


def test_zipf_requests_repeat_few_texts_often_and_are_the_same_every_time():
    from bench import text_cache

    texts = [f"query {i}" for i in range(1000)]
    requests = text_cache.zipf_requests(texts, 2000)
    assert requests == text_cache.zipf_requests(texts, 2000)
    assert all(len(r) == text_cache.REQUEST_TEXTS for r in requests)
    counts = sorted(collections.Counter(t for r in requests for t in r).values(), reverse=True)
    # Zipf, s = 1: the most frequent text comes about twice as often as the second, ten times
    # as often as the tenth; most texts are rare.
    assert 1.5 < counts[0] / counts[1] < 2.7 and 6 < counts[0] / counts[9] < 15
    assert len(counts) < 1000 and counts[-1] <= 3


def test_text_cache_targets_from_one_runs_cases():
    from bench import text_cache

    def case(setup, level, texts, p99, hit=None):
        return {"setup": setup, "level": level, "texts_per_s": texts, "p50_ms": p99 / 2,
                "p99_ms": p99, "hit_ratio": hit, "error": ""}  # fmt: skip

    result = {
        "distinct": 10_000, "request_texts": 8, "zipf_exponent": 1.0, "passes": 1,
        "replica_hit_ratio": 0.99,
        "cases": [
            case("response cache", 4, 300, 150), case("response cache", 16, 360, 400),
            case("per-text cache", 4, 900, 60, 0.7), case("per-text cache", 16, 1800, 90, 0.9),
            case("all new, no cache", 16, 380, 380), case("all new, per-text cache", 16, 361, 390),
        ],
    }  # fmt: skip
    by_name = {name: (value, threshold) for name, value, threshold, _ in text_cache.targets(result)}
    # At the response cache's best p99 (400 ms) the per-text cache reaches 1800 texts/s.
    assert by_name["per-text cache ÷ Triton's response cache, texts/s at equal p99"][0] == (
        pytest.approx(1800 / 360)
    )
    assert by_name["every text new: per-text cache ÷ no cache, texts/s"][0] == pytest.approx(0.95)
    text = "\n".join(text_cache.section(result))
    assert "| per-text cache | 16 | 1800 | 45.0 | 90.0 | 0.900 |" in text
    assert (
        "| a second replica's hit ratio on what the first one served | 0.990 | ≥ 0.95 | yes |"
        in text
    )


def test_overload_texts_never_repeat_across_the_capacity_loop_and_the_overload(monkeypatch):
    """Each benchmark phase makes its own inputs; a repeated text would be a cache hit."""
    from bench import overload

    sent = []
    monkeypatch.setattr(overload.embed, "build_inputs", lambda grpc, texts: sent.extend(texts))
    capacity, overloaded = overload.text_inputs(None), overload.text_inputs(None)
    for i in range(20):
        capacity(i)
        overloaded(i)
    assert len(set(sent)) == len(sent) == 40
