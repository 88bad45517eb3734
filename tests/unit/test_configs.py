"""Every config parses with Triton's own schema, follows the spec, and ensembles are wired right."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from export import onnx_export
from export.model_config import parse, resolve
from pipelines import classification as spec
from pipelines import embedding as emb
from server.launcher import MODEL_REPOSITORY

CONFIG_FILES = sorted(MODEL_REPOSITORY.glob("*/config.pbtxt")) + sorted(
    MODEL_REPOSITORY.glob("*/configs/*.pbtxt")
)
ENVIRONMENTS = sorted({p.stem for p in MODEL_REPOSITORY.glob("*/configs/*.pbtxt")})
SHAPE = [spec.CHANNELS, spec.IMAGE_SIZE, spec.IMAGE_SIZE]

# The contract of each model, from pipelines.classification: name -> (inputs, outputs).
CONTRACT = {
    spec.PREPROCESS: ({spec.IMAGE: (mc.TYPE_STRING, [1])}, {spec.PIXELS: (mc.TYPE_FP32, SHAPE)}),
    spec.CLASSIFIER: (
        {spec.PIXELS: (mc.TYPE_FP32, SHAPE)},
        {spec.LOGITS: (mc.TYPE_FP32, [spec.NUM_CLASSES])},
    ),
    spec.POSTPROCESS: (
        {spec.LOGITS: (mc.TYPE_FP32, [spec.NUM_CLASSES]), spec.TOP_K: (mc.TYPE_INT32, [1])},
        {
            spec.LABELS: (mc.TYPE_STRING, [-1]),
            spec.SCORES: (mc.TYPE_FP32, [-1]),
            spec.CLASS_IDS: (mc.TYPE_INT32, [-1]),
        },
    ),
}
CONTRACT[spec.ENSEMBLE] = (
    {spec.IMAGE: CONTRACT[spec.PREPROCESS][0][spec.IMAGE], spec.TOP_K: (mc.TYPE_INT32, [1])},
    CONTRACT[spec.POSTPROCESS][1],
)
TOKENS = {emb.INPUT_IDS: (mc.TYPE_INT64, [-1]), emb.ATTENTION_MASK: (mc.TYPE_INT64, [-1])}
TEXT = {emb.TEXT: (mc.TYPE_STRING, [1])}
EMBEDDING = {emb.EMBEDDING: (mc.TYPE_FP32, [emb.HIDDEN_SIZE])}
CONTRACT.update(
    {
        emb.TOKENIZE: (TEXT, TOKENS),
        emb.ENCODER: (TOKENS, EMBEDDING),
        emb.ENSEMBLE: (TEXT, EMBEDDING),
        "embed_int8": (TEXT, EMBEDDING),
        emb.GRAPH_ENSEMBLE: (TEXT, EMBEDDING),
    }
)


def test_repository_has_the_classification_models():
    assert CONFIG_FILES, "no configs found"
    names = {p.parent.name for p in MODEL_REPOSITORY.glob("*/config.pbtxt")}
    assert set(CONTRACT) <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(MODEL_REPOSITORY)))
def test_config_parses_and_follows_conventions(path: Path):
    config = parse(path)
    model_dir = path.parent if path.name == "config.pbtxt" else path.parent.parent
    assert config.name == model_dir.name, "name must equal the model's folder"
    if config.platform == "ensemble":
        assert config.ensemble_scheduling.step
        return
    assert config.backend in {"python", "onnxruntime", "tensorrt"}
    if config.max_batch_size > 0:
        assert config.HasField("dynamic_batching"), "every batched model batches dynamically"
        batching = config.dynamic_batching
        assert all(0 < s <= config.max_batch_size for s in batching.preferred_batch_size)
    assert config.instance_group, "instance_group is explicit for every environment"
    if config.backend == "python":
        assert (model_dir / "1" / "model.py").exists()


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(MODEL_REPOSITORY)))
def test_config_matches_the_spec(path: Path):
    config = parse(path)
    if config.name not in CONTRACT:
        pytest.skip(f"{config.name} is not part of the classification service")
    inputs, outputs = CONTRACT[config.name]
    assert {t.name: (t.data_type, list(t.dims)) for t in config.input} == inputs
    assert {t.name: (t.data_type, list(t.dims)) for t in config.output} == outputs
    optional = {t.name for t in config.input if t.optional}
    assert optional == ({spec.TOP_K} if spec.TOP_K in inputs else set())


@pytest.mark.parametrize("model", [spec.CLASSIFIER, emb.ENCODER])
def test_environment_configs_pick_the_right_devices(model):
    model_dir = MODEL_REPOSITORY / model
    local = parse(model_dir / "configs" / "local.pbtxt")
    assert local.backend == "python"
    assert {g.kind for g in local.instance_group} == {mc.ModelInstanceGroup.KIND_CPU}
    # GPU configs say how many instances per GPU; which GPUs is generated at start
    # (server/gpus.py), so a hand-written gpus list is a mistake.
    backends = {"gpu": "tensorrt", "gpu-ort": "onnxruntime"}
    for name, backend in backends.items():
        gpu = parse(model_dir / "configs" / f"{name}.pbtxt")
        assert gpu.backend == backend
        assert all(g.kind == mc.ModelInstanceGroup.KIND_GPU for g in gpu.instance_group)
        assert not any(g.gpus for g in gpu.instance_group)
        assert gpu.model_warmup, "the first requests must not pay for lazy initialization"
    default = parse(model_dir / "config.pbtxt")
    assert default.backend == "onnxruntime"
    # The Python runner honours the onnxruntime backend's thread parameters under the same names.
    for config in (local, default):
        assert {"intra_op_thread_count", "inter_op_thread_count"} <= set(config.parameters)


@pytest.mark.parametrize("environment", [None, *ENVIRONMENTS])
def test_ensemble_wiring(environment: str | None):
    """Each step's maps name real inputs/outputs, every tensor has a producer, types agree."""
    for ensemble_dir in MODEL_REPOSITORY.iterdir():
        if not (ensemble_dir / "config.pbtxt").exists():
            continue
        ensemble = resolve(ensemble_dir, environment)
        if ensemble.platform != "ensemble":
            continue
        available = {t.name: (t.data_type, list(t.dims)) for t in ensemble.input}
        for step in ensemble.ensemble_scheduling.step:
            model = resolve(MODEL_REPOSITORY / step.model_name, environment)
            assert model.max_batch_size >= ensemble.max_batch_size, step.model_name
            model_inputs = {t.name: t for t in model.input}
            assert set(step.input_map) <= set(model_inputs), step.model_name
            required = {t.name for t in model.input if not t.optional}
            assert required <= set(step.input_map), f"{step.model_name} misses inputs"
            for key, tensor in step.input_map.items():
                assert tensor in available, f"{tensor} is used before any step produces it"
                assert available[tensor][0] == model_inputs[key].data_type, (step.model_name, key)
                assert available[tensor][1] == list(model_inputs[key].dims), (step.model_name, key)
            model_outputs = {t.name: t for t in model.output}
            assert set(step.output_map) <= set(model_outputs), step.model_name
            for key, tensor in step.output_map.items():
                assert tensor not in available, f"{tensor} is produced twice"
                out = model_outputs[key]
                available[tensor] = (out.data_type, list(out.dims))
        for out in ensemble.output:
            assert out.name in available, f"ensemble output {out.name} is never produced"
            assert available[out.name] == (out.data_type, list(out.dims))


def test_exported_onnx_matches_the_spec(classifier_onnx):
    model = onnx.load(str(classifier_onnx))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    dims = onnx_export.dynamic_axes_of(model)
    assert dims == {spec.PIXELS: ["batch", *SHAPE], spec.LOGITS: ["batch", spec.NUM_CLASSES]}
    assert not [n for n in model.graph.node if n.op_type == "Pad"], "pads are folded into convs"


def test_exported_encoders_match_the_spec(encoder_onnx):
    for path in encoder_onnx:
        dims = onnx_export.dynamic_axes_of(onnx.load(str(path)))
        assert dims == {
            emb.INPUT_IDS: ["batch", "sequence"],
            emb.ATTENTION_MASK: ["batch", "sequence"],
            emb.EMBEDDING: ["batch", emb.HIDDEN_SIZE],
        }


def test_encoder_versions_and_ensembles_pin_them():
    for config_path in [
        MODEL_REPOSITORY / emb.ENCODER / "config.pbtxt",
        *(MODEL_REPOSITORY / emb.ENCODER / "configs").glob("*.pbtxt"),
    ]:
        assert list(parse(config_path).version_policy.specific.versions) == [1, 2]
    for ensemble, version in ((emb.ENSEMBLE, 1), ("embed_int8", 2)):
        config = parse(MODEL_REPOSITORY / ensemble / "config.pbtxt")
        (step,) = [s for s in config.ensemble_scheduling.step if s.model_name == emb.ENCODER]
        assert step.model_version == version
        assert config.response_cache.enable
