"""The SLO tuner's model and search on recorded curves (no server)."""

from __future__ import annotations

import shutil

import pytest

import model_config
from bench.harness import perf_analyzer
from paths import MODEL_REPOSITORY
from pipelines import classification
from tune import search

# Raw EfficientNet-Lite0 curves measured here (images/s by batch size, per thread budget).
RAW = {
    1: {1: 212.0, 2: 211.0, 4: 209.0, 8: 189.0, 16: 176.0, 32: 152.0},
    2: {1: 307.0, 2: 350.0, 4: 379.0, 8: 351.0, 16: 314.0, 32: 299.0},
}


def test_prediction_follows_the_raw_curve():
    one = search.predict(search.Candidate(1, 0, 1), RAW[2], cores=2)
    four = search.predict(search.Candidate(4, 0, 1), RAW[2], cores=2)
    assert one.capacity == pytest.approx(307.0)
    assert four.capacity == pytest.approx(379.0)
    # A batch of 4 at 379 images/s takes 10.554 ms; a request waits for the batch ahead and
    # then its own (21.108 ms on average), and the p99 is 1.4 times that mean: 29.551 ms.
    assert four.p99_ms == pytest.approx(29.551, abs=1e-3)
    # 5 ms of queue delay: 5 ms more on the mean, 7 ms on the p99.
    delayed = search.predict(search.Candidate(4, 5000, 1), RAW[2], cores=2)
    assert delayed.p99_ms == pytest.approx(36.551, abs=1e-3)


def test_instances_share_the_cores():
    # Two single-thread instances on two cores run side by side; on one core they take turns.
    two_cores = search.predict(search.Candidate(4, 0, 2), RAW[1], cores=2)
    one_core = search.predict(search.Candidate(4, 0, 2), RAW[1], cores=1)
    assert two_cores.capacity == pytest.approx(2 * 209.0)
    assert one_core.capacity == pytest.approx(209.0)


def test_ranking_prunes_what_cannot_meet_the_slo():
    space = search.candidates(max_batch=32, max_instances=2)
    assert len(space) == len(search.BATCHES) * len(search.DELAYS_US) * 2
    ranked = search.rank(space, RAW, cores=2, slo_ms=40)
    assert ranked and all(p.p99_ms <= 40 for p in ranked)
    assert len(ranked) < len(space)
    capacities = [p.capacity for p in ranked]
    assert capacities == sorted(capacities, reverse=True)
    assert all(p.candidate.preferred_batch < 32 for p in ranked)  # b=32 takes > 100 ms


def curve(capacity: float, base_ms: float):
    """A closed-loop server: latency grows with concurrency once capacity is reached."""
    calls = []

    def measure(level: int) -> perf_analyzer.Point:
        calls.append(level)
        throughput = min(capacity, level * 1000 / base_ms)
        latency = max(base_ms, level * 1000 / capacity)
        return perf_analyzer.Point(level, throughput, latency, latency, latency, latency * 1.2,
                                   latency, 0, 0)  # fmt: skip

    return measure, calls


def batching_curve():
    """Throughput keeps growing with concurrency (batches fill), and so does latency."""
    calls = []

    def measure(level: int) -> perf_analyzer.Point:
        calls.append(level)
        throughput = 300 * level / (level + 4)
        latency = 1000 * level / throughput
        return perf_analyzer.Point(level, throughput, latency, latency, latency, latency * 1.2,
                                   latency, 0, 0)  # fmt: skip

    return measure, calls


def test_search_doubles_then_bisects_until_the_slo_breaks():
    measure, calls = batching_curve()
    throughput, p99, level = search.max_throughput_under_slo(measure, slo_ms=60)
    # p99 at c=8 is 48 ms, at c=16 80 ms (breaks); the bisection tries 12 (64 ms, breaks too).
    assert calls == [1, 2, 4, 8, 16, 12]
    assert (round(throughput), level) == (200, 8)
    assert p99 == pytest.approx(48)


def test_search_stops_once_more_clients_add_no_throughput():
    measure, calls = curve(capacity=200, base_ms=10)
    throughput, _, level = search.max_throughput_under_slo(measure, slo_ms=500)
    assert calls == [1, 2, 4, 8]  # flat twice in a row (4 and 8) ends the climb
    assert (throughput, level) == (200, 2)


def test_search_reports_zero_when_even_one_client_is_too_slow():
    measure, _ = curve(capacity=50, base_ms=100)
    assert search.max_throughput_under_slo(measure, slo_ms=50)[0] == 0


def test_search_stops_at_the_budget_but_verifies_at_least_one():
    ranked = search.rank(search.candidates(32, 2), RAW, cores=2, slo_ms=60)
    loaded = []
    measure, _ = curve(capacity=300, base_ms=5)
    results = search.search(ranked, loaded.append, measure, 60, budget_s=0, progress=lambda _: None)
    assert len(results) == 1 and loaded == [ranked[0].candidate]


def test_search_measures_every_shape_then_the_delays_of_the_best():
    ranked = search.rank(search.candidates(32, 2), RAW, cores=2, slo_ms=60)
    shapes = {(p.candidate.preferred_batch, p.candidate.instances) for p in ranked}
    loaded = []

    def measure_for(candidate_list):
        def measure(level):
            c = candidate_list[-1]
            # The real server likes batch 4 with one instance best, whatever the model said.
            capacity = 250.0 if (c.preferred_batch, c.instances) == (4, 1) else 150.0
            return perf_analyzer.Point(level, min(capacity, 50.0 * level), 10, 10, 10, 12, 10,
                                       0, 0)  # fmt: skip

        return measure

    results = search.search(ranked, loaded.append, measure_for(loaded), 60, budget_s=1e9,
                          progress=lambda _: None)  # fmt: skip
    first_stage = loaded[: len(shapes)]
    assert {(c.preferred_batch, c.instances) for c in first_stage} == shapes
    assert all(c.delay_us == min(search.DELAYS_US) for c in first_stage)
    rest = loaded[len(shapes) :]
    assert rest and all((c.preferred_batch, c.instances) == (4, 1) for c in rest)
    assert len(results) == len(loaded) == len(set(loaded))
    assert search.best(results).candidate.preferred_batch == 4


def test_a_shared_server_pairs_each_models_best_shapes_best_first():
    space = search.candidates(32, 2)
    ranked = {"a": search.rank(space, RAW, cores=2, slo_ms=60)}
    ranked["b"] = search.rank(space, {t: {b: v / 2 for b, v in c.items()} for t, c in RAW.items()},
                            cores=2, slo_ms=60)  # fmt: skip
    picks = search.shared_picks(ranked, per_model=3)
    tops = {m: search.shapes(r)[:3] for m, r in ranked.items()}
    assert len(picks) == 9 and len({search.label(p) for p in picks}) == 9
    # Each model's best shape in the first pair, then one step down one model's ranking.
    assert picks[0] == {"a": tops["a"][0].candidate, "b": tops["b"][0].candidate}
    assert {search.label(p) for p in picks[1:3]} == {
        search.label({"a": tops["a"][1].candidate, "b": tops["b"][0].candidate}),
        search.label({"a": tops["a"][0].candidate, "b": tops["b"][1].candidate}),
    }
    assert picks[-1] == {"a": tops["a"][2].candidate, "b": tops["b"][2].candidate}
    with pytest.raises(ValueError, match="two models"):
        search.shared_picks({"a": ranked["a"]})
    assert search.shared_picks({"a": ranked["a"], "b": []}) == []  # b meets the SLO in no shape


def test_a_shared_search_verifies_pairs_in_order_within_the_budget():
    space = search.candidates(32, 2)
    ranked = {m: search.rank(space, RAW, cores=2, slo_ms=60) for m in ("a", "b")}
    picks = search.shared_picks(ranked)
    loaded, lines = [], []
    measure, _ = curve(capacity=300, base_ms=5)
    results = search.search_picks(picks, loaded.append, measure, 60, 1e9, lines.append)
    assert loaded == picks and [r.candidate for r in results] == picks
    assert lines[0].startswith("[1 verified,") and "ETA" in lines[0]
    loaded.clear()
    assert len(search.search_picks(picks, loaded.append, measure, 60, 0, lines.append)) == 1


def test_the_winner_is_written_as_a_valid_config(tmp_path):
    repository = tmp_path / "repo"
    for step in (classification.PREPROCESS, classification.CLASSIFIER, classification.POSTPROCESS):
        shutil.copytree(MODEL_REPOSITORY / step, repository / step, symlinks=True,
                        ignore=shutil.ignore_patterns("*.onnx", "local-tuned.pbtxt"))  # fmt: skip
    variant = search.variant_for(search.Candidate(4, 500, 2), classification.ENSEMBLE, cores=2)
    tuned = variant.configs(repository, "local")
    paths = search.write_configs(variant, repository, "local", "local-tuned", "header line")
    assert sorted(p.parent.parent.name for p in paths) == [
        classification.CLASSIFIER,
        classification.PREPROCESS,
    ]
    classifier = model_config.parse(
        repository / classification.CLASSIFIER / "configs/local-tuned.pbtxt"
    )
    assert classifier.backend == "python"  # derived from the local variant
    assert list(classifier.dynamic_batching.preferred_batch_size) == [4]
    assert classifier.dynamic_batching.max_queue_delay_microseconds == 500
    assert classifier.instance_group[0].count == 2
    assert classifier.parameters["intra_op_thread_count"].string_value == "1"
    assert "preferred [4], delay 500 us" in search.describe(paths[0])
    for path in paths:
        step = path.parent.parent
        # What Triton reads is the tuned config exactly; its source holds only what differs.
        assert model_config.parse(path) == tuned[step.name]
        overlay = model_config.overlay_path(step, "local-tuned")
        assert overlay.read_text().startswith("# header line\n")
        assert model_config.redundant_fields(step, "local-tuned") == []
        assert "max_batch_size" not in model_config.read_overlay(overlay).fields
    assert not model_config.stale(repository)


def test_summary_compares_with_brute_force():
    a = search.Verified(search.Candidate(1, 0, 1), 190.0, 30.0, 4, 20.0)
    b = search.Verified(search.Candidate(2, 0, 1), 200.0, 35.0, 8, 25.0)
    out = search.summary([a], [a, b])
    assert out["tuner_vs_brute_force"] == pytest.approx(0.95)
    assert out["brute_force_seconds"] == 45.0 and out["tuner_verified"] == 1


def test_brute_force_verifies_every_candidate():
    space = search.candidates(max_batch=4, max_instances=2)
    loaded = []
    measure, _ = curve(capacity=300, base_ms=5)
    results = search.verify_all(space, loaded.append, measure, 60, progress=lambda _: None)
    assert loaded == space and len(results) == len(space)


def test_rematch_alternates_the_two_winners():
    a, b = search.Candidate(4, 0, 1), search.Candidate(1, 500, 1)
    loaded = []
    measure, _ = curve(capacity=300, base_ms=5)
    got = search.head_to_head(a, b, loaded.append, measure, 60, progress=lambda _: None)
    assert loaded == [a, b, a, b]
    assert got == (300, 300)
    out = search.summary([], None, rematch=got)
    assert out["rematch_tuner_vs_brute_force"] == 1.0


def test_embed_tunes_the_encoder_only():
    variant = search.variant_for(search.Candidate(8, 1000, 1), "embed", cores=1)
    assert variant.models == ("encoder",) and "embed" in variant.ensembles
    (config,) = variant.configs(MODEL_REPOSITORY, "local").values()
    assert config.name == "encoder" and config.backend == "python"
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert list(config.version_policy.specific.versions) == [1, 2]
    assert search.RAW_KIND["embed"] == "embed"
