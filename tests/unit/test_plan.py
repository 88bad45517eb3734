"""What each run of ``bench perf`` measures: the default computes every target, and no less.

Pure plan logic: the rows a plan's cases would give, with made-up figures, go through the
report's own CSV reader and ratios; nothing is started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness import perf_analyzer, variants
from bench.harness.plan import MODELS, TEXT_MODELS, Case, Plan
from bench.harness.runner import Row, write_csv
from bench.report.points import load
from bench.report.ratios import METRICS, TARGETS, metric_table
from pipelines import classification

# Figures without a target that docs/performance.md quotes from the report.
QUOTED = (
    "raw model batching gain (best batch ÷ batch 1)",
    "raw embed batching gain (best batch ÷ batch 1)",
    "embed served ÷ raw embed pipeline, saturation (gRPC, short texts)",
    "INT8 ÷ fp32 encoder, served embed (gRPC, c=16)",
    "INT8 ÷ fp32 encoder, raw embed pipeline (best batch)",
)


def _point(case: Case) -> perf_analyzer.Point:
    # Servers that do no work answer far faster: the load generator's headroom stays above 2x.
    fast = case.system == "null-peer" or case.dataset == "repeated"
    throughput = 100_000.0 if fast else 100.0 + case.level
    p99 = 1.0 if fast else 10.0 + case.level
    return perf_analyzer.Point(case.level, throughput, p99 / 2, p99, p99, p99, p99 / 2, 0.0, 0.0)


def _rows(plan: Plan) -> list[Row]:
    """One row per case and round, as a run without failures writes them."""
    rows = []
    for r in range(1, plan.rounds + 1):
        for case in plan.cases():
            counts = case.model == "embed" and case.system in ("triton", "peer")
            tokens = (100.0, 110.0) if counts and case.dataset == "mixed" else None
            rows.append(Row(r, case, _point(case), tokens=tokens))
        for model, protocol in plan.rate_targets:
            for fraction in plan.rate_fractions:
                level = round(100 * fraction)
                case = Case("triton", variants.SERVED, model, protocol, "binary", "rate", level)
                rows.append(Row(r, case, _point(case)))
    return rows


def _raw_curves(plan: Plan) -> dict[str, list[int]]:
    curves = {
        "model": plan.raw_model_batches,
        "pipeline": plan.raw_pipeline_batches,
        "embed": plan.raw_embed_batches,
        "embed_int8": plan.raw_embed_batches,
    }
    for kind in ("mixed_padded", "mixed_sorted", "mixed_padded_ratio", "mixed_sorted_ratio"):
        curves[kind] = plan.raw_mixed_batches
    return curves


def computable(plan: Plan, folder: Path) -> set[str]:
    """Names of the report's metrics and targets that a run of ``plan`` has a value for."""
    lines = [row.flat() for row in _rows(plan)]
    curves = {kind: {b: 100.0 + b for b in batches} for kind, batches in _raw_curves(plan).items()}
    points, raw = write_csv(folder, lines, {r: curves for r in range(1, plan.rounds + 1)})
    rows, curves = load(points, raw)
    table = metric_table(rows, curves, METRICS + TARGETS)
    return {item["metric"].name for item in table if item["values"]}


def test_the_default_computes_every_target_the_thorough_run_does(tmp_path):
    targeted = {m.name for m in METRICS + TARGETS if m.target is not None}
    (tmp_path / "thorough").mkdir()
    (tmp_path / "default").mkdir()
    thorough = computable(Plan.thorough(), tmp_path / "thorough")
    default = computable(Plan.short(), tmp_path / "default")
    assert thorough & targeted <= default
    assert set(QUOTED) <= default
    # Every embedding target, and every image-service target but binary HTTP's headroom,
    # which no run measures (no null peer for binary tensors outside --full).
    missing = targeted - default
    assert missing == {
        "load generator headroom, binary HTTP (null model ÷ fastest binary HTTP result)"
    }


def test_the_default_measures_both_services_and_every_peer():
    plan = Plan.short()
    cases = plan.cases()
    assert {c.model for c in cases if c.system == "triton"} == {*MODELS, *TEXT_MODELS}
    assert {c.system for c in cases} == {"triton", "peer", "null-peer", "infinity"}
    assert {c.model for c in cases if c.system == "peer"} == {
        classification.CLASSIFIER,
        classification.ENSEMBLE,
        "embed",
    }
    # Every ratio is taken within a round: one round gives each of them, --rounds 2 the spread.
    assert plan.rounds == 1
    # One traced case, where the ensemble's overhead per step is read.
    assert [(c.model, c.protocol, c.level) for c in plan.traced_cases()] == [
        (classification.ENSEMBLE, "grpc", 1)
    ]
    # Its length: docs/performance.md#how-long-a-run-takes. A level more needs a look at it.
    assert plan.size() * plan.rounds <= 51


@pytest.mark.parametrize(
    ("small", "big"),
    [(Plan.short, Plan.thorough), (Plan.thorough, Plan.full), (Plan.short, Plan.full)],
)
def test_each_longer_run_measures_everything_a_shorter_one_does(small, big):
    a, b = small(), big()
    assert set(a.cases()) <= set(b.cases())
    assert set(a.rate_targets) <= set(b.rate_targets)
    assert set(a.rate_fractions) <= set(b.rate_fractions)
    for batches in (
        "raw_model_batches",
        "raw_pipeline_batches",
        "raw_embed_batches",
        "raw_mixed_batches",
    ):
        assert set(getattr(a, batches)) <= set(getattr(b, batches))
    assert a.rounds <= b.rounds and (b.text_cache or not a.text_cache)
    assert b.size() > a.size()


def test_the_thorough_run_is_the_former_default():
    plan = Plan.thorough()
    cases = plan.cases()
    assert plan.size() * plan.rounds == 134  # the run of 2026-12-03 (docs/performance.md)
    assert {c.variant for c in cases if c.system == "triton"} == {
        variants.SERVED,
        "no-batching",
        "instances-2",
        "traced",
    }
    assert {(c.model, c.protocol) for c in plan.traced_cases()} == {
        (classification.ENSEMBLE, "grpc"),
        (classification.ENSEMBLE, "http"),
        (classification.FUSED, "grpc"),
        (classification.FUSED, "http"),
    }
    assert plan.rate_targets and plan.text_cache


def test_size_counts_the_cases_a_round_runs():
    for plan in (Plan.short(), Plan.thorough(), Plan.full(), Plan.embed_peers(), Plan.mixed()):
        cases = plan.cases()
        assert len(set(cases)) == len(cases)
        rates = len(plan.rate_fractions) * len(plan.rate_targets)
        assert plan.size() == len(cases) + rates
        # The peers' cases are the plan's peer levels, each with its null twin where asked.
        for model in plan.peer_levels:
            by_system = plan.peer_cases(model)
            assert all(c.system == s and c.model == model for s in by_system for c in by_system[s])
