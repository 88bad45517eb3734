"""Model Analyzer's set-up and its picks translated into the changes the tuner makes.

What a real run of it found: docs/studies/2026-12-02-model-analyzer-beside-the-tuner.md. These
tests need no server: the config
it is given, the repository it reads, and the translation of the configs it writes (as
Model Analyzer 1.58 writes them: max_batch_size, instance count, an empty dynamic_batching).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import model_config
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding
from tune import model_analyzer, search

SLO = 60.0


def analyzer_config(name: str, max_batch: int, instances: int) -> model_config_pb2.ModelConfig:
    """A config as Model Analyzer writes one into its output repository."""
    config = model_config.resolve(MODEL_REPOSITORY / name, "local")
    config.max_batch_size = max_batch
    del config.instance_group[:]
    config.instance_group.add(count=instances, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    config.ClearField("dynamic_batching")
    config.dynamic_batching.SetInParent()
    return config


def write_output(out: Path, variant: str, config: model_config_pb2.ModelConfig) -> None:
    folder = out / "output-repository" / variant
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))


def test_its_config_becomes_the_candidate_bench_tune_would_write():
    config = analyzer_config(classification.CLASSIFIER, max_batch=4, instances=2)
    assert model_analyzer.candidate(config) == search.Candidate(
        preferred_batch=4, delay_us=0, instances=2
    )
    config.dynamic_batching.max_queue_delay_microseconds = 500
    assert model_analyzer.candidate(config).delay_us == 500


def test_the_translated_pick_changes_batching_and_instances_and_keeps_max_batch_size():
    pick = model_analyzer.candidate(
        analyzer_config(classification.CLASSIFIER, max_batch=2, instances=2)
    )
    variant = search.variant_for(pick, classification.CLASSIFIER, cores=1)
    config = variant.configs(MODEL_REPOSITORY, "local")[classification.CLASSIFIER]
    base = model_config.resolve(MODEL_REPOSITORY / classification.CLASSIFIER, "local")
    overlay = model_config.overlay_text(config, base)
    # The repository's ensembles need max_batch_size as it is: the batches are capped instead.
    assert config.max_batch_size == base.max_batch_size
    assert list(config.dynamic_batching.preferred_batch_size) == [2]
    assert [g.count for g in config.instance_group] == [2]
    assert "max_batch_size" not in overlay
    assert "preferred_batch_size: 2" in overlay and "count: 2" in overlay


def test_the_best_row_of_a_single_model_run_is_read_back(tmp_path):
    write_output(tmp_path, "classifier_config_2", analyzer_config(classification.CLASSIFIER, 2, 1))
    write_output(tmp_path, "classifier_config_3", analyzer_config(classification.CLASSIFIER, 8, 2))
    rows = [
        {"Model Config Path": "classifier_config_2", "Throughput (infer/sec)": "99.1",
         "p99 Latency (ms)": "42.5"},
        {"Model Config Path": "classifier_config_3", "Throughput (infer/sec)": "120.0",
         "p99 Latency (ms)": "182.7"},  # more throughput, over the SLO
    ]  # fmt: skip
    best = model_analyzer.best_row(rows, SLO)
    assert best["Model Config Path"] == "classifier_config_2"
    assert model_analyzer.pick(
        tmp_path, best, model_analyzer.target(classification.CLASSIFIER)
    ) == search.Candidate(2, 0, 1)
    assert model_analyzer.best_row(rows[1:], SLO) is None


def test_an_ensembles_row_names_each_steps_config(tmp_path):
    for step, batch in (
        (classification.PREPROCESS, 2),
        (classification.CLASSIFIER, 4),
        (classification.POSTPROCESS, 1),
    ):
        write_output(tmp_path, f"{step}_config_{batch}", analyzer_config(step, batch, 1))
    ensemble = model_config.resolve(MODEL_REPOSITORY / classification.ENSEMBLE, "local")
    write_output(tmp_path, "classify_config_16", ensemble)
    row = {
        "Model Config Path": "classify_config_16: preprocess_config_2, classifier_config_4, "
        "postprocess_config_1"
    }
    pick = model_analyzer.pick(tmp_path, row, model_analyzer.target(classification.ENSEMBLE))
    assert pick == {
        classification.PREPROCESS: search.Candidate(2, 0, 1),
        classification.CLASSIFIER: search.Candidate(4, 0, 1),
        classification.POSTPROCESS: search.Candidate(1, 0, 1),
    }
    # The tuner loads it as it is: one change per step it names.
    variant = search.variant_for(pick, classification.ENSEMBLE, cores=1)
    configs = variant.configs(MODEL_REPOSITORY, "local")
    assert list(configs[classification.POSTPROCESS].dynamic_batching.preferred_batch_size) == [1]


def test_a_shared_servers_row_is_read_per_model(tmp_path):
    """Models profiled at once: one row, each value the aggregate then each model's (1.58)."""
    write_output(tmp_path, "classifier_config_1", analyzer_config(classification.CLASSIFIER, 4, 2))
    write_output(tmp_path, "encoder_config_1", analyzer_config(embedding.ENCODER, 8, 1))
    write_output(tmp_path, "classifier_config_2", analyzer_config(classification.CLASSIFIER, 8, 1))
    write_output(tmp_path, "encoder_config_2", analyzer_config(embedding.ENCODER, 16, 1))
    rows = [
        {"Model Config Path": "classifier_config_1,encoder_config_1",
         "Throughput (infer/sec)": "103.5, [36.8,66.6]", "p99 Latency (ms)": "65.0, [80.8,49.3]"},
        # More throughput and a mean p99 within the SLO, but the classifier's is not.
        {"Model Config Path": "classifier_config_2,encoder_config_2",
         "Throughput (infer/sec)": "110.0, [40.0,70.0]", "p99 Latency (ms)": "90.0, [130.0,50.0]"},
    ]  # fmt: skip
    assert model_analyzer.number(rows[0]["Throughput (infer/sec)"]) == 103.5
    assert model_analyzer.per_model(rows[1]["p99 Latency (ms)"]) == [130.0, 50.0]
    best = model_analyzer.best_row(rows, 100.0)
    assert best is rows[0]
    pick = model_analyzer.pick(tmp_path, best, model_analyzer.target("shared"))
    assert pick == {
        classification.CLASSIFIER: search.Candidate(4, 0, 2),
        embedding.ENCODER: search.Candidate(8, 0, 1),
    }
    configs = search.variant_for(pick, search.SHARED, cores=1).configs(MODEL_REPOSITORY, "local")
    assert list(configs[classification.CLASSIFIER].dynamic_batching.preferred_batch_size) == [4]
    assert list(configs[embedding.ENCODER].dynamic_batching.preferred_batch_size) == [8]


def test_the_models_it_reads_have_no_preferred_sizes_or_queue_policy_and_one_encoder():
    encoder = model_analyzer.step_config(embedding.ENCODER, "local")
    assert list(encoder.version_policy.specific.versions) == [1]
    assert not encoder.dynamic_batching.preferred_batch_size
    assert encoder.dynamic_batching.max_queue_delay_microseconds == 2000  # the rest kept
    shed = model_analyzer.step_config(classification.CLASSIFIER, "local-shed")
    assert not shed.dynamic_batching.HasField("default_queue_policy")


def test_its_repository_links_the_versions_and_writes_the_configs(tmp_path):
    model_analyzer.write_repository(
        model_analyzer.target(classification.ENSEMBLE), tmp_path, "local"
    )
    for step in (
        classification.ENSEMBLE,
        classification.PREPROCESS,
        classification.CLASSIFIER,
        classification.POSTPROCESS,
    ):
        assert model_config.parse(tmp_path / step / "config.pbtxt").name == step
        assert (tmp_path / step / "1").resolve() == (MODEL_REPOSITORY / step / "1").resolve()
    model_analyzer.write_repository(
        model_analyzer.target(embedding.ENCODER), tmp_path / "enc", "local"
    )
    assert [p.name for p in (tmp_path / "enc" / embedding.ENCODER).iterdir() if p.is_dir()] == ["1"]


def test_the_profile_config_holds_the_slo_the_bounds_and_the_inputs(tmp_path):
    data = {embedding.ENCODER: tmp_path / "encoder.json"}
    config = model_analyzer.profile_config(
        model_analyzer.target(embedding.ENCODER),
        "brute",
        SLO,
        tmp_path,
        tmp_path,
        tmp_path / "ts",
        data,
        2,
    )
    assert config["constraints"] == {"perf_latency_p99": {"max": 60}}
    assert config["objectives"] == ["perf_throughput"]
    assert config["run_config_search_max_model_batch_size"] == max(search.BATCHES)
    assert config["run_config_search_max_instance_count"] == 2
    entry = config["profile_models"][embedding.ENCODER]
    assert entry["cpu_only"] is True
    assert entry["perf_analyzer_flags"] == {"input-data": str(data[embedding.ENCODER]),
                                            "model-version": "1"}  # fmt: skip
    shared = model_analyzer.profile_config(
        model_analyzer.target("shared"), "quick", SLO, tmp_path, tmp_path, tmp_path / "ts",
        {classification.CLASSIFIER: tmp_path / "c.json", embedding.ENCODER: tmp_path / "e.json"}, 2,
    )  # fmt: skip
    assert shared["run_config_profile_models_concurrently_enable"] is True
    classify = model_analyzer.profile_config(
        model_analyzer.target(classification.ENSEMBLE), "quick", SLO, tmp_path, tmp_path,
        tmp_path / "ts", {classification.ENSEMBLE: tmp_path / "c.json"}, 2,
    )  # fmt: skip
    assert classify["cpu_only_composing_models"] == [
        classification.PREPROCESS, classification.CLASSIFIER, classification.POSTPROCESS
    ]  # fmt: skip


def test_a_search_it_does_not_have_or_an_unknown_target_is_refused(tmp_path):
    with pytest.raises(ValueError, match="brute search does not take classify"):
        model_analyzer.profile_config(model_analyzer.target(classification.ENSEMBLE), "brute", SLO,
                                      tmp_path, tmp_path, tmp_path, {}, 2)  # fmt: skip
    with pytest.raises(ValueError, match="no target 'embed_graph'"):
        model_analyzer.target("embed_graph")


def test_its_tritonserver_is_ours_pinned_with_the_stubs_environment(tmp_path):
    script = model_analyzer.server_script(tmp_path / "tritonserver", [1]).read_text()
    assert "exec taskset -c 1 " in script and "--disable-auto-complete-config" in script
    assert "--backend-directory=" in script and "export LD_LIBRARY_PATH=" in script


def test_the_eta_bounds_every_search_it_can_make_here():
    one, shared = model_analyzer.target(classification.CLASSIFIER), model_analyzer.target("shared")
    # 6 batch sizes x 2 instance counts, and the default; 7 concurrencies (1-64).
    assert model_analyzer.measurement_bound(one, "brute", 2) == 13 * 7
    assert model_analyzer.measurement_bound(one, "quick", 2) == 13 + 2 * 7
    assert model_analyzer.measurement_bound(shared, "quick", 2) == 12 * 12 + 1 + 2 * 7
    # The quick search of the classifier seen here measured 11 times; the brute one 49 times.
    assert model_analyzer.measurement_bound(one, "quick", 2) >= 11
    assert model_analyzer.measurement_bound(one, "brute", 2) >= 49


def test_bench_tune_hands_it_only_targets_it_is_set_up_for():
    from tune import session

    assert set(session.SEARCH) == set(search.TARGETS)
    handed = {t for t, who in session.SEARCH.items() if who == session.MODEL_ANALYZER}
    assert handed and handed <= set(model_analyzer.TARGETS)
