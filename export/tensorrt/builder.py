"""Building engines with the TensorRT 10 Python API, and reading a built engine back.

Precision: TensorRT 10 builds weakly typed networks with the FP16 flag (and INT8 for a Q/DQ
model); TensorRT 11 only builds strongly typed networks, so there the FP16 engine is built from
an FP16 copy of the ONNX model and the types in the graph decide.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import shutil
from pathlib import Path
from types import ModuleType

from export.tensorrt.checks import check_engine
from export.tensorrt.profiles import (
    DEFAULT_WORKSPACE_MIB,
    EngineSpec,
    Recipe,
    Shapes,
    profiles_for,
)
from export.tensorrt.trtexec import trtexec_command

log = logging.getLogger(__name__)


def load_tensorrt() -> ModuleType | None:
    """The TensorRT Python module, or None.

    ``tensorrt_bindings`` is the bindings-only wheel the container installs over its own
    libnvinfer, so that engines are built by the TensorRT that Triton's backend loads.
    """
    for name in ("tensorrt", "tensorrt_bindings"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def major_version(trt: ModuleType) -> int:
    """TensorRT's major version (10, 11, ...)."""
    return int(str(trt.__version__).split(".")[0])


def unavailable_reason() -> str | None:
    """Why engines cannot be built here, or None when TensorRT and a CUDA GPU are present."""
    trt = load_tensorrt()
    if trt is None:
        return "TensorRT is not installed (no `tensorrt` or `tensorrt_bindings` module)"
    if major_version(trt) < 10:
        return f"TensorRT {trt.__version__} is older than 10"
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU (nvidia-smi not found)"
    return None


def fingerprint(
    recipe: Recipe,
    repository: Path,
    trt_version: str,
    workspace_mib: int = DEFAULT_WORKSPACE_MIB,
) -> str:
    """What an engine is built from: the ONNX bytes, the profiles, precision, TensorRT, workspace.

    A cached plan whose fingerprint differs was built from something else (a re-exported
    model, a changed config, another TensorRT) and must be built again.
    """
    digest = hashlib.sha256()
    with open(recipe.onnx_path(repository), "rb") as onnx:
        for block in iter(lambda: onnx.read(1 << 20), b""):
            digest.update(block)
    profiles = [
        {name: [shapes.min, shapes.opt, shapes.max] for name, shapes in profile.items()}
        for profile in recipe.profiles(repository)
    ]
    described = {
        "onnx_sha256": digest.hexdigest(),
        "profiles": profiles,
        "precision": recipe.precision,
        "tensorrt": trt_version,
        "workspace_mib": workspace_mib,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def fp16_onnx(source: Path, target: Path) -> Path:
    """An FP16 copy of an fp32 ONNX model with fp32 inputs/outputs, for strongly typed builds.

    Uses onnxruntime's float16 converter (keep_io_types: the Triton config is unchanged).
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    onnx.save(model, str(target))
    return target


def build(
    recipe: Recipe,
    repository: Path,
    plan: Path,
    timing_cache: Path | None = None,
    workspace_mib: int = DEFAULT_WORKSPACE_MIB,
) -> EngineSpec:
    """Build ``recipe``'s engine into ``plan`` and check it against the config; returns its spec.

    The timing cache is read before and written after the build, so a second build on the same
    GPU (another model version, a rebuilt container) skips most kernel timing.

    Raises:
        RuntimeError: TensorRT is unavailable, the ONNX parser or the builder failed, or the
            built engine does not satisfy the config.
    """
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"cannot build {recipe.model}/{recipe.version}: {reason}")
    trt = load_tensorrt()
    config = recipe.config(repository)
    profiles = profiles_for(config, recipe.dynamic)
    source = recipe.onnx_path(repository)
    strongly_typed = major_version(trt) >= 11
    if strongly_typed and recipe.precision == "fp16":
        source = fp16_onnx(source, plan.with_suffix(".fp16.onnx"))
    log.info(
        "equivalent command: %s",
        " ".join(
            trtexec_command(
                source,
                plan,
                profiles,
                recipe.precision,
                workspace_mib,
                timing_cache,
                strongly_typed,
            )
        ),
    )
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(source)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError(f"ONNX parser failed on {source}: {errors}")
    build_config = builder.create_builder_config()
    build_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if not strongly_typed:
        if recipe.precision in ("fp16", "int8"):
            build_config.set_flag(trt.BuilderFlag.FP16)
        if recipe.precision == "int8":
            build_config.set_flag(trt.BuilderFlag.INT8)
    cached = timing_cache.read_bytes() if timing_cache and timing_cache.exists() else b""
    build_config.set_timing_cache(build_config.create_timing_cache(cached), ignore_mismatch=True)
    for profile in profiles:
        optimization = builder.create_optimization_profile()
        for name, shapes in profile.items():
            optimization.set_shape(name, shapes.min, shapes.opt, shapes.max)
        build_config.add_optimization_profile(optimization)
    serialized = builder.build_serialized_network(network, build_config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build {recipe.model}/{recipe.version}")
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_bytes(bytes(memoryview(serialized)))
    if timing_cache is not None:
        timing_cache.write_bytes(bytes(memoryview(build_config.get_timing_cache().serialize())))
    spec = read_engine(plan)
    problems = check_engine(config, spec)
    if problems:
        raise RuntimeError(f"{plan} does not match {recipe.config_path(repository)}: {problems}")
    return spec


def deserialize(plan: Path):
    """The TensorRT module and the engine deserialized from ``plan``.

    Raises:
        RuntimeError: the plan was built for another GPU or TensorRT version.
    """
    trt = load_tensorrt()
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(plan.read_bytes())
    if engine is None:
        raise RuntimeError(f"{plan} is not an engine for this GPU and TensorRT version")
    return trt, engine


def read_engine(plan: Path) -> EngineSpec:
    """An engine's inputs, outputs, dtypes and optimization profiles, read from the plan."""
    trt, engine = deserialize(plan)
    inputs, outputs, dtypes = {}, {}, {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = tuple(engine.get_tensor_shape(name))
        dtypes[name] = trt.nptype(engine.get_tensor_dtype(name))
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        (inputs if is_input else outputs)[name] = shape
    profiles = [
        {
            name: Shapes(*(tuple(s) for s in engine.get_tensor_profile_shape(name, index)))
            for name in inputs
        }
        for index in range(engine.num_optimization_profiles)
    ]
    return EngineSpec(inputs, outputs, profiles, dtypes)
