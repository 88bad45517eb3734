"""TensorRT export pieces that need no GPU: profiles from configs, trtexec commands, the
config/engine consistency check, the FP16 model for strongly typed builds; and the build
itself where TensorRT and a GPU exist."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import model_config
from export import tensorrt as trt_export
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding, padding
from server.gpus import Gpu, place_instances


def gpu_config(model: str):
    return model_config.parse(MODEL_REPOSITORY / model / "configs" / "gpu.pbtxt")


def recipe(model: str, version: str = "1") -> trt_export.Recipe:
    return next(r for r in trt_export.recipes() if (r.model, r.version) == (model, version))


@pytest.mark.parametrize(
    ("max_batch", "preferred", "expected"),
    [
        (128, [16, 64, 128], [(1, 16, 16), (17, 64, 64), (65, 128, 128)]),
        (32, [4], [(1, 4, 4), (5, 32, 32)]),
        (8, [], [(1, 8, 8)]),
        (64, [64, 16, 16], [(1, 16, 16), (17, 64, 64)]),
    ],
)
def test_batch_ranges_end_at_preferred_sizes_and_reach_the_max(max_batch, preferred, expected):
    assert trt_export.batch_ranges(max_batch, preferred) == expected


@pytest.mark.parametrize(("max_batch", "preferred"), [(0, []), (16, [32]), (16, [0])])
def test_batch_ranges_refuse_impossible_configs(max_batch, preferred):
    with pytest.raises(ValueError):
        trt_export.batch_ranges(max_batch, preferred)


def test_classifier_profiles_follow_its_gpu_config():
    config = gpu_config(classification.CLASSIFIER)
    profiles = trt_export.profiles_for(config)
    assert [p[classification.PIXELS].opt[0] for p in profiles] == list(
        config.dynamic_batching.preferred_batch_size
    )
    assert profiles[-1][classification.PIXELS].max == (config.max_batch_size, 3, 224, 224)
    assert trt_export.check_engine(config, trt_export.planned_spec(config, profiles)) == []


def test_encoder_profiles_span_the_tokenizer_buckets():
    low, opt, high = trt_export.sequence_range()
    assert (low, high) == (padding.BUCKETS[0], embedding.MAX_TOKENS) and opt in padding.BUCKETS
    config = gpu_config(embedding.ENCODER)
    profiles = trt_export.profiles_for(config, recipe(embedding.ENCODER).dynamic)
    for profile in profiles:
        ids, mask = profile[embedding.INPUT_IDS], profile[embedding.ATTENTION_MASK]
        assert ids == mask
        assert (ids.min[1], ids.opt[1], ids.max[1]) == (low, opt, high)
    assert trt_export.check_engine(config, trt_export.planned_spec(config, profiles)) == []


def test_dynamic_axes_without_a_range_are_refused():
    with pytest.raises(ValueError, match="dynamic"):
        trt_export.profiles_for(gpu_config(embedding.ENCODER))


def engine_like(config, profiles, **changes) -> trt_export.EngineSpec:
    spec = trt_export.planned_spec(config, profiles)
    fields = {**spec.__dict__, **changes}
    return trt_export.EngineSpec(**fields)


def test_check_engine_names_each_mismatch():
    config = gpu_config(classification.CLASSIFIER)
    profiles = trt_export.profiles_for(config)
    short = profiles[:-1]  # an engine built for batch 64 behind a config that says 128
    assert any(
        "reach batch 64" in p for p in trt_export.check_engine(config, engine_like(config, short))
    )
    gap = [profiles[0], profiles[2]]
    assert any("17..64" in p for p in trt_export.check_engine(config, engine_like(config, gap)))
    wrong_dims = engine_like(config, profiles, inputs={classification.PIXELS: (-1, 3, 256, 256)})
    assert any("axis 2" in p for p in trt_export.check_engine(config, wrong_dims))
    renamed = engine_like(config, profiles, outputs={"output": (-1, 1000)})
    problems = trt_export.check_engine(config, renamed)
    assert any("LOGITS is not in the engine" in p for p in problems)
    assert any("not in the config" in p for p in problems)
    half = engine_like(config, profiles, dtypes={classification.PIXELS: np.float16})
    assert any("float16" in p for p in trt_export.check_engine(config, half))
    assert trt_export.check_engine(config, engine_like(config, [])) == [
        "the engine has no optimization profile"
    ]


@pytest.mark.parametrize("r", trt_export.recipes(), ids=lambda r: f"{r.model}-{r.version}")
def test_gpu_configs_keep_the_tensorrt_backends_rules(r):
    """Every profile reachable by every instance, max batch within them, each one warmed."""
    config = r.config(MODEL_REPOSITORY)
    assert trt_export.backend_problems(config, r.profiles(MODEL_REPOSITORY)) == []
    # Also once the entrypoint has placed one group per GPU.
    gpus = [Gpu(0, "GPU-a", "NVIDIA H200", 143771), Gpu(1, "GPU-b", "NVIDIA H200", 143771)]
    place_instances(config, gpus, per_gpu=2)
    assert len(config.instance_group) == 2
    assert trt_export.backend_problems(config, r.profiles(MODEL_REPOSITORY)) == []


def without(config, change):
    changed = type(config)()
    changed.CopyFrom(config)
    change(changed)
    return changed


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # The fault these configs had: no `profile` list, so profile 0 alone (batch 1-16).
        (lambda c: c.instance_group[0].ClearField("profile"), "auto-complete refuses"),
        (lambda c: c.instance_group[0].ClearField("profile"), "batch 17..128"),
        (lambda c: c.instance_group[0].profile.append("3"), "profiles [3] not in the engine"),
        # Groups that split the profiles: a batch of 100 may reach the profile-0 group.
        (
            lambda c: c.instance_group.add().CopyFrom(
                type(c.instance_group[0])(kind=c.instance_group[0].kind, count=1, profile=["0"])
            ),
            "batch 17..128 of max_batch_size 128 in none",
        ),
        (lambda c: c.model_warmup.pop(1), "profile 1 (batch 17..64) gets no warmup"),
        (
            lambda c: c.optimization.cuda.graph_spec[0].ClearField("input"),
            "graph_lower_bound without `input`",
        ),
        (
            lambda c: setattr(c.optimization.cuda.graph_spec[2], "batch_size", 256),
            "graph_spec batch 256 is in no profile",
        ),
    ],
)
def test_backend_rules_name_what_the_tensorrt_backend_would_refuse(change, expected):
    r = recipe(classification.CLASSIFIER)
    config = without(r.config(MODEL_REPOSITORY), change)
    problems = trt_export.backend_problems(config, r.profiles(MODEL_REPOSITORY))
    assert any(expected in p for p in problems), problems
    # A built engine is held to the same rules.
    spec = trt_export.planned_spec(config, r.profiles(MODEL_REPOSITORY))
    assert trt_export.check_engine(config, spec) == problems


@pytest.mark.parametrize("r", trt_export.recipes(), ids=lambda r: f"{r.model}-{r.version}")
def test_gpu_ort_configs_build_their_engines_at_load(r):
    config = model_config.parse(MODEL_REPOSITORY / r.model / "configs" / "gpu-ort.pbtxt")
    assert trt_export.ort_tensorrt_problems(config, r.dynamic) == []


def test_gpu_ort_rules_want_profiles_or_warmups_at_both_corners():
    classifier = model_config.parse(
        MODEL_REPOSITORY / classification.CLASSIFIER / "configs" / "gpu-ort.pbtxt"
    )
    accelerator = classifier.optimization.execution_accelerators.gpu_execution_accelerator[0]
    accelerator.parameters["trt_profile_max_shapes"] = "PIXELS:64x3x224x224"
    assert "trt_profile_max_shapes" in trt_export.ort_tensorrt_problems(classifier)[0]
    del accelerator.parameters["trt_profile_min_shapes"]
    assert "give all of" in trt_export.ort_tensorrt_problems(classifier)[0]
    r = recipe(embedding.ENCODER)
    encoder = model_config.parse(MODEL_REPOSITORY / r.model / "configs" / "gpu-ort.pbtxt")
    encoder.model_warmup.pop(0)  # the batch-1 x 16-token sample
    assert "smallest shape" in trt_export.ort_tensorrt_problems(encoder, r.dynamic)[0]


def test_trtexec_command_uses_tensorrt_10_flags(tmp_path):
    config = gpu_config(embedding.ENCODER)
    profiles = trt_export.profiles_for(config, recipe(embedding.ENCODER).dynamic)
    cmd = trt_export.trtexec_command(
        tmp_path / "model.onnx", tmp_path / "model.plan", profiles, "fp16", 2048, tmp_path / "tc"
    )
    assert cmd[0] == "trtexec" and "--fp16" in cmd
    assert "--explicitBatch" not in cmd and not any(a.startswith("--workspace") for a in cmd)
    assert "--memPoolSize=workspace:2048M" in cmd and f"--timingCacheFile={tmp_path / 'tc'}" in cmd
    mins = [a for a in cmd if a.startswith("--minShapes=")]
    assert len(mins) == len(profiles)
    assert mins[0] == "--minShapes=INPUT_IDS:1x16,ATTENTION_MASK:1x16"
    assert "--maxShapes=INPUT_IDS:64x256,ATTENTION_MASK:64x256" in cmd
    int8 = trt_export.trtexec_command(tmp_path / "q.onnx", tmp_path / "p", profiles, "int8")
    assert "--int8" in int8
    typed = trt_export.trtexec_command(
        tmp_path / "h.onnx", tmp_path / "p", profiles, "fp16", strongly_typed=True
    )
    assert "--stronglyTyped" in typed and "--fp16" not in typed
    with pytest.raises(ValueError):
        trt_export.trtexec_command(tmp_path / "m", tmp_path / "p", profiles, "fp8")


def test_every_recipe_has_its_onnx_and_config(classifier_onnx, encoder_onnx):
    for r in trt_export.recipes():
        assert r.onnx_path(MODEL_REPOSITORY).exists(), r
        assert r.config_path(MODEL_REPOSITORY).exists(), r
        assert r.precision in trt_export.PRECISIONS


def test_every_engine_is_compared_with_the_fp32_model():
    # Encoder version 2's own ONNX is dynamic INT8: comparing the INT8 engine with it would
    # measure one approximation against another.
    for r in trt_export.recipes():
        assert r.reference_path(MODEL_REPOSITORY) == MODEL_REPOSITORY / r.model / "1" / "model.onnx"
    int8 = recipe(embedding.ENCODER, "2")
    assert int8.precision == "int8"
    assert int8.reference_path(MODEL_REPOSITORY) != int8.onnx_path(MODEL_REPOSITORY).with_name(
        "model.onnx"
    )


def test_fp16_model_for_strongly_typed_builds_keeps_fp32_io(tmp_path, classifier_onnx):
    from export.efficientnet_lite0 import photos_batch

    half = trt_export.fp16_onnx(classifier_onnx, tmp_path / "model.fp16.onnx")
    pixels = photos_batch()
    want = ort.InferenceSession(str(classifier_onnx)).run(None, {classification.PIXELS: pixels})[0]
    got = ort.InferenceSession(str(half)).run(None, {classification.PIXELS: pixels})[0]
    assert got.dtype == np.float32
    assert (got.argmax(1) == want.argmax(1)).all()
    assert np.abs(got - want).max() < trt_export.FP16_LOGIT_ATOL


def test_build_and_parity_where_tensorrt_and_a_gpu_exist(tmp_path, classifier_onnx):
    reason = trt_export.unavailable_reason()
    if reason:
        pytest.skip(f"engine build not exercised here: {reason}")
    r = recipe(classification.CLASSIFIER)
    plan = tmp_path / "model.plan"
    spec = trt_export.build(r, MODEL_REPOSITORY, plan, tmp_path / "timing.cache")
    assert (tmp_path / "timing.cache").stat().st_size > 0
    assert len(spec.profiles) == len(gpu_config(r.model).dynamic_batching.preferred_batch_size)
    report = trt_export.parity(r, MODEL_REPOSITORY, plan)
    assert report.top1_agreement == 1.0
