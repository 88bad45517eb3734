"""GPU discovery parsing, CUDA_VISIBLE_DEVICES renumbering, per-GPU instance groups, and the
linked repository copy that carries them."""

from __future__ import annotations

import shutil

import pytest
from tritonclient.grpc import model_config_pb2

import model_config
from paths import MODEL_REPOSITORY
from server import gpus, launcher, repository

SMI = """0, GPU-1111aaaa, NVIDIA H200, 143771
1, GPU-2222bbbb, NVIDIA H200, 143771
2, GPU-3333cccc, NVIDIA L4, 23034
"""
MACHINE = gpus.parse_nvidia_smi(SMI)


def test_nvidia_smi_csv_is_parsed():
    assert MACHINE[2] == gpus.Gpu(2, "GPU-3333cccc", "NVIDIA L4", 23034)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, ["GPU-1111aaaa", "GPU-2222bbbb", "GPU-3333cccc"]),
        ("2,0", ["GPU-3333cccc", "GPU-1111aaaa"]),
        ("GPU-2222", ["GPU-2222bbbb"]),
        ("1,7,2", ["GPU-2222bbbb"]),  # CUDA stops at the first invalid entry
        ("", []),
    ],
)
def test_cuda_visible_devices_selects_and_renumbers(visible, expected):
    chosen = gpus.visible(MACHINE, visible)
    assert [g.uuid for g in chosen] == expected
    assert [g.index for g in chosen] == list(range(len(expected)))


def classifier_gpu_config() -> model_config_pb2.ModelConfig:
    return model_config.parse(MODEL_REPOSITORY / "classifier" / "configs" / "gpu.pbtxt")


def test_one_group_per_gpu_with_the_requested_count():
    config = classifier_gpu_config()
    gpus.place_instances(config, MACHINE[:2], per_gpu=3)
    assert [(list(g.gpus), g.count, g.kind) for g in config.instance_group] == [
        ([0], 3, model_config_pb2.ModelInstanceGroup.KIND_GPU),
        ([1], 3, model_config_pb2.ModelInstanceGroup.KIND_GPU),
    ]
    assert len({g.name for g in config.instance_group}) == 2


def test_hand_placed_and_cpu_groups_are_kept():
    config = model_config_pb2.ModelConfig(name="m")
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_GPU, count=2, gpus=[1])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=4)
    before = config.SerializeToString()
    gpus.place_instances(config, MACHINE, per_gpu=None)
    assert config.SerializeToString() == before


def test_without_gpus_the_groups_run_on_cpu():
    config = classifier_gpu_config()
    gpus.place_instances(config, [], per_gpu=None)
    assert [(g.kind, g.count) for g in config.instance_group] == [
        (model_config_pb2.ModelInstanceGroup.KIND_CPU, 1)
    ]


@pytest.mark.parametrize(
    ("backends", "machine", "expected"),
    [
        (["python"], [], "local"),  # the bundled server: no onnxruntime backend
        (["python"], MACHINE[:1], "gpu-local"),
        (["python", "onnxruntime", "tensorrt"], [], None),  # the NGC container on CPU
        (["python", "onnxruntime", "tensorrt"], MACHINE[:1], "gpu"),
    ],
)
def test_environment_follows_backends_and_gpus(tmp_path, backends, machine, expected):
    assert launcher.detect_environment(installation(tmp_path, backends), machine) == expected


def installation(folder, backends) -> launcher.Installation:
    """A stand-in installation whose backends/ holds these folders: both kinds of server are
    covered wherever the tests run, whichever tritonserver this machine has."""
    for name in backends:
        (folder / "backends" / name).mkdir(parents=True, exist_ok=True)
    return launcher.Installation(
        folder / "bin" / "tritonserver", folder / "backends", folder / "caches", False
    )


NGC = ["python", "onnxruntime", "tensorrt"]
BUNDLED = ["python"]


def test_materialized_repository_links_files_and_writes_only_generated_configs(tmp_path):
    plan = tmp_path / "engines" / "classifier.plan"
    plan.parent.mkdir()
    plan.write_bytes(b"engine")
    out = repository.materialize(
        MODEL_REPOSITORY, tmp_path / "repo", "gpu", MACHINE[:2], 2, {("classifier", "1"): plan}
    )
    written = out / "classifier" / "configs" / "gpu.pbtxt"
    assert not written.is_symlink() and written.read_text().startswith("# Generated")
    config = model_config.parse(written)
    assert [list(g.gpus) for g in config.instance_group] == [[0], [1]]
    assert (out / "classifier" / "1" / "model.plan").resolve() == plan.resolve()
    # Everything else links back to the checked-in files, the ensembles included.
    assert (out / "classify" / "config.pbtxt").resolve() == (
        MODEL_REPOSITORY / "classify" / "config.pbtxt"
    ).resolve()
    assert (out / "tokenize" / "1" / "model.py").is_symlink()
    assert not list(out.rglob("__pycache__"))
    # Materializing again (a restart) replaces the links and configs in place.
    repository.materialize(MODEL_REPOSITORY, out, "gpu", MACHINE[:1], 1)
    assert [list(g.gpus) for g in model_config.parse(written).instance_group] == [[0]]


def test_container_cache_key_separates_gpu_models_and_tensorrt_versions():
    from server import container

    assert container.cache_key(MACHINE[0], "10.5.0") == "nvidia-h200-trt10.5.0"
    assert container.cache_key(MACHINE[2], "10.5.0") != container.cache_key(MACHINE[0], "10.5.0")
    assert container.cache_key(MACHINE[0], "10.6.0") != container.cache_key(MACHINE[0], "10.5.0")


def test_container_refuses_mixed_gpu_models_before_building(tmp_path):
    from server import container

    with pytest.raises(RuntimeError, match="one model"):
        container.ensure_engines(MODEL_REPOSITORY, tmp_path, MACHINE)


def test_container_serves_everywhere_and_passes_arguments_through(tmp_path):
    from server import container

    ngc = installation(tmp_path / "ngc", NGC)
    config = container.server_config(
        ["--log-verbose=1"], {"TRITON_INSTANCES_PER_GPU": "2"}, MACHINE, ngc
    )
    assert (config.host, config.http_port, config.grpc_port, config.metrics_port) == (
        "0.0.0.0",
        8000,
        8001,
        8002,
    )
    assert config.model_config_name == "gpu" and config.instances_per_gpu == 2
    assert config.extra_args == ["--log-verbose=1"]
    alt = container.server_config([], {"TRITON_MODEL_CONFIG_NAME": "gpu-ort"}, MACHINE, ngc)
    assert alt.model_config_name == "gpu-ort" and alt.instances_per_gpu is None
    assert container.server_config([], {}, [], ngc).model_config_name is None
    assert alt.response_cache_url is None and alt.text_cache_url is None
    environ = {
        "TRITON_RESPONSE_CACHE_REDIS_URL": "redis://:pw@redis:6379/1",
        "EMBED_TEXT_CACHE_URL": "redis://:pw@redis:6379/0",
    }
    cached = container.server_config([], environ, MACHINE, ngc)
    assert cached.response_cache_url == environ["TRITON_RESPONSE_CACHE_REDIS_URL"]
    assert cached.text_cache_url == environ["EMBED_TEXT_CACHE_URL"]


@pytest.mark.parametrize(
    ("backends", "machine", "environ", "expected"),
    [
        (NGC, [], {"TRITON_MODEL_CONFIG_NAME": "gpu"}, None),  # the GPU image on a CPU host
        (BUNDLED, [], {}, "local"),  # the CPU image
        (BUNDLED, [], {"TRITON_MODEL_CONFIG_NAME": "gpu"}, "local"),  # compose's GPU default
        (BUNDLED, [], {"TRITON_MODEL_CONFIG_NAME": "local-shed"}, "local-shed"),
        (BUNDLED, MACHINE[:1], {}, "gpu-local"),
    ],
)
def test_container_serves_the_configs_its_server_and_machine_can_run(
    tmp_path, backends, machine, environ, expected
):
    from server import container

    config = container.server_config([], environ, machine, installation(tmp_path, backends))
    assert config.model_config_name == expected


def test_cached_engines_are_rebuilt_when_what_they_were_built_from_changes(tmp_path, monkeypatch):
    """Cached plans are keyed by GPU and TensorRT, and checked against a fingerprint of the
    ONNX bytes, the profiles and the precision, then against the config when read back."""
    import types

    from export import tensorrt
    from server import container

    repository, cache = tmp_path / "repository", tmp_path / "engines"
    for r in tensorrt.recipes():
        (repository / r.model / "configs").mkdir(parents=True, exist_ok=True)
        shutil.copy(r.config_path(MODEL_REPOSITORY), r.config_path(repository))
        r.onnx_path(repository).parent.mkdir(parents=True, exist_ok=True)
        r.onnx_path(repository).write_bytes(f"{r.model}/{r.version} weights".encode())
    builds, served = [], {}

    def build(recipe, repository, plan, timing_cache):
        builds.append((recipe.model, recipe.version))
        plan.parent.mkdir(parents=True, exist_ok=True)
        plan.write_bytes(b"plan")
        served[(recipe.model, recipe.version)] = recipe.profiles(repository)

    def read_engine(plan):
        model, version = plan.parts[-3], plan.parts[-2]
        config = model_config.parse(repository / model / "configs" / "gpu.pbtxt")
        return tensorrt.planned_spec(config, served[(model, version)])

    monkeypatch.setattr(
        tensorrt, "load_tensorrt", lambda: types.SimpleNamespace(__version__="10.5.0")
    )
    monkeypatch.setattr(tensorrt, "build", build)
    monkeypatch.setattr(tensorrt, "read_engine", read_engine)
    one_gpu = MACHINE[:1]

    engines = container.ensure_engines(repository, cache, one_gpu)
    assert sorted(builds) == sorted(engines) and len(builds) == 3
    builds.clear()
    container.ensure_engines(repository, cache, one_gpu)
    assert builds == []  # all cached and current
    # A re-exported model: only its engine is rebuilt.
    (repository / "encoder" / "1" / "model.onnx").write_bytes(b"re-exported weights")
    container.ensure_engines(repository, cache, one_gpu)
    assert builds == [("encoder", "1")]
    builds.clear()
    # A config with other batch ranges: new profiles, new engine.
    config_path = repository / "classifier" / "configs" / "gpu.pbtxt"
    text = config_path.read_text()  # rendered: one preferred_batch_size per line
    config_path.write_text(text.replace("preferred_batch_size: 16\n", "preferred_batch_size: 32\n"))
    container.ensure_engines(repository, cache, one_gpu)
    assert builds == [("classifier", "1")]
    builds.clear()
    # A plan that no longer serves its config when read back (e.g. written by hand).
    served[("encoder", "2")] = served[("encoder", "2")][:1]
    container.ensure_engines(repository, cache, one_gpu)
    assert builds == [("encoder", "2")]
