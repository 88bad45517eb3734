"""Every config parses with Triton's own schema, follows the spec, and ensembles are wired right.

Also the variants: each overlay holds only what differs from its base, renders as
model_config/ says, and its rendered configs/ file (what Triton reads) is up to date.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from tritonclient.grpc import model_config_pb2

import model_config
from export import onnx_export
from model_config import parse, resolve, signatures
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding

# (model folder, variant name) of every overlay; their rendered configs are what Triton reads.
VARIANTS = [
    (d, name)
    for d in model_config.model_dirs(MODEL_REPOSITORY)
    for name in model_config.variant_names(d)
]
CONFIG_FILES = sorted(MODEL_REPOSITORY.glob("*/config.pbtxt")) + [
    model_config.config_path(d, name) for d, name in VARIANTS
]
ENVIRONMENTS = sorted({name for _, name in VARIANTS})


def test_a_request_of_texts_holds_what_embed_takes_at_once():
    """texts_as_batch's limit, and the gateway's chunks, are embed's max_batch_size."""
    for model in (embedding.ENSEMBLE, embedding.INT8_ENSEMBLE, *embedding.OPENAI_MODELS.values()):
        assert (
            parse(MODEL_REPOSITORY / model / "config.pbtxt").max_batch_size == embedding.MAX_TEXTS
        )
    assert parse(MODEL_REPOSITORY / embedding.TEXT_ROWS / "config.pbtxt").max_batch_size == 0


def test_every_model_has_a_signature_and_every_signature_a_model():
    assert CONFIG_FILES, "no configs found"
    names = {p.parent.name for p in MODEL_REPOSITORY.glob("*/config.pbtxt")}
    assert set(signatures.SIGNATURES) == names


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
def test_config_matches_its_signature(path: Path):
    config = parse(path)
    assert signatures.problems(config, signatures.SIGNATURES[config.name]) == []


SAYS_IMAGE = "the signature says TYPE_STRING [1]"


@pytest.mark.parametrize(
    "drift, expected",
    [
        (lambda c: c.input[0].dims.append(1), "input IMAGE: TYPE_STRING [1, 1], " + SAYS_IMAGE),
        (lambda c: setattr(c.input[0], "data_type", model_config_pb2.TYPE_UINT8),
         "input IMAGE: TYPE_UINT8 [1], " + SAYS_IMAGE),
        (lambda c: setattr(c.input[1], "optional", False), "input TOP_K: TYPE_INT32 [1], "
         "the signature says TYPE_INT32 [1] optional"),
        (lambda c: c.input.add(name="EXTRA"), "input EXTRA: not in the signature"),
        (lambda c: c.output.pop(), "output CLASS_IDS: missing (the signature has TYPE_INT32 [-1])"),
        (lambda c: setattr(c.output[1], "name", "PROBS"), "output PROBS: not in the signature"),
    ],
)  # fmt: skip
def test_a_config_off_its_signature_is_named(drift, expected):
    config = parse(MODEL_REPOSITORY / classification.ENSEMBLE / "config.pbtxt")
    assert [t.name for t in config.input] == [classification.IMAGE, classification.TOP_K]
    assert [t.name for t in config.output][-1] == classification.CLASS_IDS
    drift(config)
    found = signatures.problems(config, signatures.SIGNATURES[classification.ENSEMBLE])
    assert expected in found, found


def test_make_models_refuses_a_variant_off_its_signature(tmp_path: Path):
    """The command that renders the configs fails on a drifted overlay, naming its file."""
    model_dir = tmp_path / embedding.ENCODER
    shutil.copytree(MODEL_REPOSITORY / embedding.ENCODER, model_dir, ignore=_weights)
    main = [sys.executable, "-m", "model_config", "--repository", str(tmp_path)]
    assert subprocess.run(main, capture_output=True, text=True).returncode == 0
    overlay = model_config.overlay_path(model_dir, "local")
    ids = '{ name: "INPUT_IDS" data_type: TYPE_INT32 dims: [-1] }'
    mask = '{ name: "ATTENTION_MASK" data_type: TYPE_INT64 dims: [-1] }'
    overlay.write_text(f"{overlay.read_text()}input [{ids}, {mask}]\n")
    for argv in (main, [*main, "--check"]):
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 1, done.stderr
        assert (
            "encoder/configs/local.overlay.pbtxt: input INPUT_IDS: TYPE_INT32 [-1], "
            "the signature says TYPE_INT64 [-1]"
        ) in done.stderr


def _weights(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n.endswith((".onnx", ".plan", ".data"))]


@pytest.mark.parametrize("model", [classification.CLASSIFIER, embedding.ENCODER])
def test_environment_configs_pick_the_right_devices(model):
    model_dir = MODEL_REPOSITORY / model
    local = parse(model_dir / "configs" / "local.pbtxt")
    assert local.backend == "python"
    assert {g.kind for g in local.instance_group} == {model_config_pb2.ModelInstanceGroup.KIND_CPU}
    # GPU configs say how many instances per GPU; which GPUs is generated at start
    # (server/gpus.py), so a hand-written gpus list is a mistake.
    backends = {"gpu": "tensorrt", "gpu-ort": "onnxruntime"}
    for name, backend in backends.items():
        gpu = parse(model_dir / "configs" / f"{name}.pbtxt")
        assert gpu.backend == backend
        assert all(
            g.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU for g in gpu.instance_group
        )
        assert not any(g.gpus for g in gpu.instance_group)
        assert gpu.model_warmup, "the first requests must not pay for lazy initialization"
    default = parse(model_dir / "config.pbtxt")
    assert default.backend == "onnxruntime"
    # The Python runner honours the onnxruntime backend's thread parameters under the same names.
    for config in (local, default):
        assert {"intra_op_thread_count", "inter_op_thread_count"} <= set(config.parameters)


@pytest.mark.parametrize("environment", [None, *ENVIRONMENTS])
def test_ensemble_wiring(environment: str | None):
    """Each step's maps name real inputs/outputs, every tensor has a producer, types agree.

    Shapes are compared whole: a batching model's tensors have the batch dimension in front of
    their dims, so a non-batching ensemble's [-1, 1] is a batching step's [1].
    """

    def full(model, tensor) -> tuple[int, list[int]]:
        dims = list(tensor.dims)
        return tensor.data_type, [-1, *dims] if model.max_batch_size > 0 else dims

    for ensemble_dir in MODEL_REPOSITORY.iterdir():
        if not (ensemble_dir / "config.pbtxt").exists():
            continue
        ensemble = resolve(ensemble_dir, environment)
        if ensemble.platform != "ensemble":
            continue
        available = {t.name: full(ensemble, t) for t in ensemble.input}
        for step in ensemble.ensemble_scheduling.step:
            model = resolve(MODEL_REPOSITORY / step.model_name, environment)
            assert model.max_batch_size >= ensemble.max_batch_size, step.model_name
            model_inputs = {t.name: t for t in model.input}
            assert set(step.input_map) <= set(model_inputs), step.model_name
            required = {t.name for t in model.input if not t.optional}
            assert required <= set(step.input_map), f"{step.model_name} misses inputs"
            for key, tensor in step.input_map.items():
                assert tensor in available, f"{tensor} is used before any step produces it"
                assert available[tensor] == full(model, model_inputs[key]), (step.model_name, key)
            model_outputs = {t.name: t for t in model.output}
            assert set(step.output_map) <= set(model_outputs), step.model_name
            for key, tensor in step.output_map.items():
                assert tensor not in available, f"{tensor} is produced twice"
                available[tensor] = full(model, model_outputs[key])
        for out in ensemble.output:
            assert out.name in available, f"ensemble output {out.name} is never produced"
            assert available[out.name] == full(ensemble, out)


def test_exported_onnx_matches_the_spec(classifier_onnx):
    model = onnx.load(str(classifier_onnx))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    assert onnx_export.dynamic_axes_of(model) == _axes(classification.CLASSIFIER)
    assert not [n for n in model.graph.node if n.op_type == "Pad"], "pads are folded into convs"


def test_exported_encoders_match_the_spec(encoder_onnx):
    for path in encoder_onnx:
        assert onnx_export.dynamic_axes_of(onnx.load(str(path))) == _axes(embedding.ENCODER)


def _axes(model: str) -> dict[str, list]:
    """The ONNX graph's axes its config's signature implies: batch first, -1 a sequence."""
    signature = signatures.SIGNATURES[model]
    return {
        t.name: ["batch", *("sequence" if d == -1 else d for d in t.dims)]
        for t in (*signature.inputs, *signature.outputs)
    }


def test_encoder_versions_and_ensembles_pin_them():
    for config_path in [
        MODEL_REPOSITORY / embedding.ENCODER / "config.pbtxt",
        *(model_config.config_path(d, n) for d, n in VARIANTS if d.name == embedding.ENCODER),
    ]:
        assert list(parse(config_path).version_policy.specific.versions) == [1, 2]
    for ensemble, version in ((embedding.ENSEMBLE, 1), ("embed_int8", 2)):
        config = parse(MODEL_REPOSITORY / ensemble / "config.pbtxt")
        (step,) = [s for s in config.ensemble_scheduling.step if s.model_name == embedding.ENCODER]
        assert step.model_version == version
        assert config.response_cache.enable


# Variants: overlays over config.pbtxt, rendered into configs/ -------------------------------


def test_rendered_configs_are_up_to_date():
    """configs/ (what Triton reads) is what the overlays render today: no edit left unrendered."""
    problems = model_config.stale(MODEL_REPOSITORY)
    assert not problems, "run `make models` (python -m model_config):\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("model_dir", "name"), VARIANTS, ids=[f"{d.name}/{n}" for d, n in VARIANTS]
)
def test_overlay_writes_only_what_differs_from_its_base(model_dir: Path, name: str):
    redundant = model_config.redundant_fields(model_dir, name)
    base = model_config.base_of(model_dir, name) or model_config.BASE
    assert not redundant, (
        f"configs/{name}.overlay.pbtxt repeats {redundant} of {base}: leave them out"
    )


@pytest.mark.parametrize(
    ("model_dir", "name"), VARIANTS, ids=[f"{d.name}/{n}" for d, n in VARIANTS]
)
def test_overlay_text_turns_the_base_into_the_variant(model_dir: Path, name: str, tmp_path):
    """What the tuner writes (overlay_text) renders back to the config it was made from."""
    config = model_config.render(model_dir, name)
    base = model_config.base_config(model_dir, name)
    path = tmp_path / "overlay.pbtxt"
    path.write_text(model_config.overlay_text(config, base))
    assert model_config.apply(base, model_config.read_overlay(path)) == config


BASE_CONFIG = """
name: "m"
backend: "onnxruntime"
default_model_filename: "model.plan"
max_batch_size: 8
instance_group [ { kind: KIND_CPU, count: 1 } ]
dynamic_batching { preferred_batch_size: [ 4 ], max_queue_delay_microseconds: 100 }
model_operations { op_library_filename: "/opt/lib.so" }
parameters { key: "a", value: { string_value: "1" } }
parameters { key: "b", value: { string_value: "2" } }
"""


def make_model(root: Path, **overlays: str) -> Path:
    """A model folder with BASE_CONFIG and the given overlays (name with '_' for '-')."""
    model_dir = root / "m"
    (model_dir / "configs").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(BASE_CONFIG)
    for name, text in overlays.items():
        model_config.overlay_path(model_dir, name.replace("_", "-")).write_text(text)
    return model_dir


def test_an_overlay_field_replaces_the_base_field_wholesale(tmp_path):
    model_dir = make_model(
        tmp_path,
        local='dynamic_batching { max_queue_delay_microseconds: 0 }\nparameters { key: "a", '
        'value: { string_value: "9" } }\ninstance_group [ { kind: KIND_CPU, count: 2 } ]',
    )
    config = model_config.render(model_dir, "local")
    assert not config.dynamic_batching.preferred_batch_size, "merged, not replaced"
    assert config.HasField("dynamic_batching")
    assert dict(config.parameters) == {"a": config.parameters["a"]}
    assert config.parameters["a"].string_value == "9"
    assert [g.count for g in config.instance_group] == [2]
    assert (config.backend, config.max_batch_size) == ("onnxruntime", 8)  # not written: kept


def test_a_field_written_empty_drops_the_base_field(tmp_path):
    model_dir = make_model(
        tmp_path,
        gpu='default_model_filename: ""\nparameters: []\nmodel_operations {}\nmax_batch_size: 0',
        local="dynamic_batching {}",
    )
    config = model_config.render(model_dir, "gpu")
    expected = parse(model_dir / "config.pbtxt")
    for field in ("default_model_filename", "parameters", "model_operations", "max_batch_size"):
        expected.ClearField(field)
    assert config == expected
    # The scheduler is the exception: an empty dynamic_batching selects it with defaults.
    local = model_config.render(model_dir, "local")
    assert local.HasField("dynamic_batching") and local.dynamic_batching.ByteSize() == 0


def test_a_variant_applies_to_the_variant_its_name_extends(tmp_path):
    model_dir = make_model(
        tmp_path,
        local='backend: "python"',
        local_shed="instance_group [ { kind: KIND_CPU, count: 3 } ]",
        gpu_ort='backend: "tensorrt"',
    )
    model_config.overlay_path(model_dir, "local-shared").symlink_to("local-shed.overlay.pbtxt")
    assert model_config.base_of(model_dir, "local-shed") == "local"
    assert model_config.base_of(model_dir, "gpu-ort") is None  # no gpu: config.pbtxt
    shed = model_config.render(model_dir, "local-shed")
    assert (shed.backend, shed.instance_group[0].count) == ("python", 3)
    assert model_config.render(model_dir, "local-shared") == shed  # a link: the same variant
    written = model_config.render_repository(tmp_path)
    assert [p.name for p in written] == [
        "gpu-ort.pbtxt",
        "local.pbtxt",
        "local-shared.pbtxt",
        "local-shed.pbtxt",
    ]
    text = model_config.config_path(model_dir, "local-shared").read_text()
    assert text.startswith(model_config.GENERATED)
    chain = (
        "configs/local-shared.overlay.pbtxt (a link) over configs/local-shed.overlay.pbtxt over "
    )
    assert chain in text
    assert parse(model_config.config_path(model_dir, "local-shared")) == shed


def test_an_edited_overlay_makes_its_rendered_config_stale(tmp_path):
    model_dir = make_model(tmp_path, local='backend: "python"')
    model_config.render_repository(tmp_path)
    assert model_config.stale(tmp_path) == []
    model_config.overlay_path(model_dir, "local").write_text("max_batch_size: 4")
    assert model_config.stale(tmp_path) == [
        f"{model_config.config_path(model_dir, 'local')}: out of date with local.overlay.pbtxt "
        "or its bases"
    ]
    model_config.overlay_path(model_dir, "local").unlink()
    assert "no local.overlay.pbtxt renders it" in model_config.stale(tmp_path)[0]
    model_config.render_repository(tmp_path)  # removes the orphan it had rendered
    assert not model_config.config_path(model_dir, "local").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("instance_grup [ { kind: KIND_CPU, count: 2 } ]", 'no field named "instance_grup"'),
        ("instance_group [ { kind: KIND_CPPU } ]", "has no value named KIND_CPPU"),
        ("dynamic_batching { max_queue_delay: 5 }", 'no field named "max_queue_delay"'),
        ("max_batch_size: many", "Couldn't parse integer"),
        ('name: "other"', "sets name"),
    ],
)
def test_an_overlay_with_a_typo_fails_naming_the_file(tmp_path, text, message):
    model_dir = make_model(tmp_path, local=text)
    with pytest.raises(model_config.OverlayError) as failure:
        model_config.render_repository(tmp_path)
    assert str(model_config.overlay_path(model_dir, "local")) in str(failure.value)
    assert message in str(failure.value)
    assert not model_config.config_path(model_dir, "local").exists()


class _Descriptor:
    """A field descriptor as protobuf 7 has it (``is_repeated``, no ``label``), or as older
    releases have it (``label`` only)."""

    LABEL_REPEATED = 3

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


@pytest.mark.parametrize(
    "descriptor, repeated",
    [
        (_Descriptor(is_repeated=True), True),
        (_Descriptor(is_repeated=False), False),
        (_Descriptor(label=3), True),
        (_Descriptor(label=1), False),
    ],
)
def test_repeated_fields_are_told_apart_on_every_protobuf(descriptor, repeated):
    # The GPU host's protobuf 7.36 has no FieldDescriptor.label; overlays failed there.
    assert model_config._repeated(descriptor) is repeated
