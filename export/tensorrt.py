"""Build TensorRT engines (``model.plan``) from the repository's ONNX models, TensorRT 10 API.

Engines are specific to the GPU model and the TensorRT version, so they are built on the target
machine (the container's entrypoint does it at first start, ``server/container.py``), never
committed. Everything an engine must agree with comes from the model's Triton config
(``configs/gpu.pbtxt``): the optimization profiles cover batch 1 up to ``max_batch_size``, one
profile per batch range ending at a preferred batch size (the sizes the dynamic batcher forms
under load), each optimized (``opt``) for that preferred size; the encoder's sequence axis spans
the tokenizer's padding buckets.

Precision: TensorRT 10 builds weakly typed networks with the FP16 flag (and INT8 for a Q/DQ
model); TensorRT 11 only builds strongly typed networks, so there the FP16 engine is built from
an FP16 copy of the ONNX model and the types in the graph decide.

What needs no GPU (profiles, the ``trtexec`` command, config/engine consistency) is plain Python
and unit-tested everywhere; building, reading back and the parity check run where TensorRT and a
GPU are present and say why they are skipped otherwise.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from pipelines import classification, embedding

log = logging.getLogger(__name__)

DEFAULT_WORKSPACE_MIB = 4096
PRECISIONS = ("fp32", "fp16", "int8")
# FP16 engines against the fp32 onnxruntime model: logits of magnitude ~10-20 move by ~1e-2.
FP16_LOGIT_ATOL = 0.1
FP16_MIN_COSINE = 0.999
INT8_MIN_COSINE = 0.98

# Triton data types ↔ numpy, for the config/engine dtype check.
TRITON_DTYPES = {
    mc.TYPE_FP32: np.float32,
    mc.TYPE_FP16: np.float16,
    mc.TYPE_INT32: np.int32,
    mc.TYPE_INT64: np.int64,
    mc.TYPE_INT8: np.int8,
    mc.TYPE_UINT8: np.uint8,
    mc.TYPE_BOOL: np.bool_,
}


@dataclass(frozen=True)
class Shapes:
    """min/opt/max shape of one input in one optimization profile (batch axis first)."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def as_trtexec(self, name: str) -> tuple[str, str, str]:
        """``NAME:AxBxC`` for each of min, opt, max."""
        return tuple(f"{name}:{'x'.join(map(str, s))}" for s in (self.min, self.opt, self.max))


Profile = dict[str, Shapes]  # input name → shapes


@dataclass(frozen=True)
class EngineSpec:
    """What an engine offers Triton: its inputs (dims, -1 where dynamic), dtypes and profiles."""

    inputs: dict[str, tuple[int, ...]]
    outputs: dict[str, tuple[int, ...]]
    profiles: list[Profile]
    dtypes: dict[str, type] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipe:
    """How one model version's engine is built: which ONNX file, precision, dynamic axes."""

    model: str
    version: str
    onnx: str  # file name inside the version folder
    precision: str
    # Non-batch axes that are dynamic (-1 in the config): input → {axis: (min, opt, max)}.
    dynamic: Mapping[str, Mapping[int, tuple[int, int, int]]] = field(default_factory=dict)
    config_name: str = "gpu"

    def onnx_path(self, repository: Path) -> Path:
        """The source ONNX model."""
        return repository / self.model / self.version / self.onnx

    def reference_path(self, repository: Path) -> Path:
        """The fp32 model every engine of this model is compared with (version 1's ONNX).

        Not the version's own CPU model: encoder version 2 is dynamic INT8, itself an
        approximation of the fp32 model.
        """
        return repository / self.model / "1" / "model.onnx"

    def config_path(self, repository: Path) -> Path:
        """The Triton config the engine must satisfy."""
        return repository / self.model / "configs" / f"{self.config_name}.pbtxt"

    def config(self, repository: Path) -> mc.ModelConfig:
        """That config, parsed with Triton's schema."""
        import model_config

        return model_config.parse(self.config_path(repository))

    def profiles(self, repository: Path) -> list[Profile]:
        """The optimization profiles the engine is built with (``profiles_for`` its config)."""
        return profiles_for(self.config(repository), self.dynamic)

    def plan_path(self, engines: Path) -> Path:
        """Where the engine goes under a folder laid out like the repository."""
        return engines / self.model / self.version / "model.plan"


def sequence_range() -> tuple[int, int, int]:
    """The encoder's token axis: the tokenizer's smallest bucket, a typical sentence, the cap.

    ``opt`` is the bucket a typical short sentence lands in (the sample sentences' median),
    which is the shape most requests have.
    """
    lengths = sorted(len(ids) for ids in embedding.encode(list(_typical_texts()))[0])
    typical = embedding.bucket_length(lengths[len(lengths) // 2])
    return embedding.BUCKETS[0], typical, embedding.MAX_TOKENS


def _typical_texts() -> Sequence[str]:
    from export import text_samples

    return text_samples.SENTENCES


def recipes() -> list[Recipe]:
    """Every engine the GPU configs expect (model, version, source ONNX, precision)."""
    seq = sequence_range()
    text_axes = {embedding.INPUT_IDS: {1: seq}, embedding.ATTENTION_MASK: {1: seq}}
    return [
        Recipe(classification.CLASSIFIER, "1", "model.onnx", "fp16"),
        Recipe(embedding.ENCODER, "1", "model.onnx", "fp16", text_axes),
        # INT8 needs explicit quantization (Q/DQ nodes): the CPU model of version 2 is dynamic
        # quantization (MatMulInteger), which TensorRT cannot parse.
        Recipe(embedding.ENCODER, "2", "model.qdq.onnx", "int8", text_axes),
    ]


# Profiles from a config ------------------------------------------------------------------------
def batch_ranges(max_batch_size: int, preferred: Sequence[int]) -> list[tuple[int, int, int]]:
    """(min, opt, max) batch per profile: one range per preferred size, the last up to the max.

    Each range ends at (and is optimized for) a preferred batch size, because those are the
    batches the dynamic batcher forms; a final range reaches ``max_batch_size`` when it is
    larger than every preferred size.
    """
    if max_batch_size < 1:
        raise ValueError("TensorRT profiles need max_batch_size >= 1 (batching enabled)")
    sizes = sorted({p for p in preferred if 1 <= p <= max_batch_size})
    bad = [p for p in preferred if not 1 <= p <= max_batch_size]
    if bad:
        raise ValueError(f"preferred_batch_size {bad} outside 1..max_batch_size {max_batch_size}")
    if not sizes or sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    ranges, low = [], 1
    for size in sizes:
        ranges.append((low, size, size))
        low = size + 1
    return ranges


def profiles_for(
    config: mc.ModelConfig, dynamic: Mapping[str, Mapping[int, tuple[int, int, int]]] = {}
) -> list[Profile]:
    """The optimization profiles that make an engine serve exactly what ``config`` accepts.

    ``dynamic`` gives (min, opt, max) for non-batch axes that are -1 in the config, keyed by
    the axis index in the full (batched) shape.
    """
    preferred = list(config.dynamic_batching.preferred_batch_size)
    profiles = []
    for low, opt, high in batch_ranges(config.max_batch_size, preferred):
        profile: Profile = {}
        for tensor in config.input:
            dims = (-1, *tensor.dims)
            axes = dynamic.get(tensor.name, {})
            shapes = []
            for pick, batch in ((0, low), (1, opt), (2, high)):
                shape = [batch]
                for axis, size in enumerate(dims[1:], start=1):
                    if size >= 0:
                        shape.append(size)
                    elif axis in axes:
                        shape.append(axes[axis][pick])
                    else:
                        raise ValueError(f"{tensor.name} axis {axis} is dynamic: give its range")
                shapes.append(tuple(shape))
            profile[tensor.name] = Shapes(*shapes)
        profiles.append(profile)
    return profiles


def check_engine(config: mc.ModelConfig, engine: EngineSpec) -> list[str]:
    """Every way ``engine`` fails to serve ``config`` (empty when Triton can load and use it).

    Checks names, fixed dims, dtypes, and that the profiles cover batch 1..max_batch_size with
    no gap and reach exactly max_batch_size (Triton refuses a config whose max_batch_size is
    larger than the engine's, and a smaller one leaves engine capacity unused).
    """
    problems = []
    for kind, tensors, offered in (
        ("input", config.input, engine.inputs),
        ("output", config.output, engine.outputs),
    ):
        for tensor in tensors:
            if tensor.name not in offered:
                problems.append(f"{kind} {tensor.name} is not in the engine")
                continue
            dims = offered[tensor.name]
            want = (-1, *tensor.dims)
            if len(dims) != len(want):
                problems.append(f"{kind} {tensor.name}: engine rank {len(dims)} ≠ config {want}")
                continue
            for axis, (have, need) in enumerate(zip(dims, want, strict=True)):
                if axis and have != need:
                    problems.append(f"{kind} {tensor.name} axis {axis}: engine {have} ≠ {need}")
            expected = TRITON_DTYPES.get(tensor.data_type)
            got = engine.dtypes.get(tensor.name)
            if got is not None and expected is not None and np.dtype(got) != np.dtype(expected):
                problems.append(f"{kind} {tensor.name}: engine {np.dtype(got)} ≠ config {expected}")
        extra = set(offered) - {t.name for t in tensors}
        if extra:
            problems.append(f"engine {kind}s not in the config: {sorted(extra)}")
    if not engine.profiles:
        return [*problems, "the engine has no optimization profile"]
    first = config.input[0].name if config.input else None
    batches = sorted((p[first].min[0], p[first].max[0]) for p in engine.profiles if first in p)
    covered = 0
    for low, high in batches:
        if low > covered + 1:
            problems.append(f"batch {covered + 1}..{low - 1} is in no profile")
        covered = max(covered, high)
    if covered != config.max_batch_size:
        problems.append(
            f"profiles reach batch {covered}, config max_batch_size is {config.max_batch_size}"
        )
    for index, profile in enumerate(engine.profiles):
        for name, shapes in profile.items():
            ordered = zip(shapes.min, shapes.opt, shapes.max, strict=True)
            if not all(a <= b <= c for a, b, c in ordered):
                problems.append(f"profile {index} {name}: not min <= opt <= max: {shapes}")
        if len({(s.min[0], s.opt[0], s.max[0]) for s in profile.values()}) > 1:
            problems.append(f"profile {index}: inputs disagree on the batch range")
    if problems:
        return problems
    return backend_problems(config, engine.profiles)


def _batch_range(profile: Profile) -> tuple[int, int]:
    first = next(iter(profile.values()))
    return first.min[0], first.max[0]


def backend_problems(config: mc.ModelConfig, profiles: Sequence[Profile]) -> list[str]:
    """What Triton's TensorRT backend (r24.10) would refuse or serve badly with these profiles.

    ``profiles`` are the engine's (``profiles_for`` the config at export, ``read_engine`` of a
    built plan). The rules mirror tensorrt_backend r24.10 and core r24.10:

    * An instance uses the profiles its group names in ``profile``, else profile 0 only
      (``ModelState::GetProfileIndices``, src/model_state.cc:616-649); a name past the engine's
      profiles is an error there.
    * ``max_batch_size`` may not exceed the largest batch of the named profiles
      (``GetMaxSupportedBatchSize`` and the "configuration specified max-batch" error,
      src/model_state.cc:533-541, 594-613).
    * Each execution runs on the instance's profile whose range holds the batch; a batch that
      none holds fails ("failed to find any Optimization Profile",
      ``GetMostOptimizedProfile``, src/instance_state.cc:1390-1437). The scheduler may send
      any batch up to ``max_batch_size`` to any instance, so every group must cover them all.
    * A warmup sample runs as one batch of ``batch_size`` (core src/backend_model_instance.cc:
      435-520, 600-660), on the profile that batch selects: a profile no sample selects is
      never warmed.
    * A CUDA graph is captured per ``graph_spec`` on each context whose profile holds its batch
      (src/instance_state.cc:3225-3239, 3455-3465); ``graph_lower_bound`` lets it serve
      smaller batches only when the spec names its ``input`` shapes (3616-3649).
    """
    problems = []
    ranges = [_batch_range(p) for p in profiles]
    named: set[int] = set()
    for group in config.instance_group:
        label = (
            group.name or f"instance group of kind {mc.ModelInstanceGroup.Kind.Name(group.kind)}"
        )
        indices = [int(p) for p in group.profile] or [0]
        bad = [i for i in indices if not 0 <= i < len(ranges)]
        if bad:
            problems.append(f"{label}: profiles {bad} not in the engine's {len(ranges)}")
            continue
        named |= set(indices)
        covered = sorted(ranges[i] for i in indices)
        reach, gaps = 0, []
        for low, high in covered:
            if low > reach + 1:
                gaps.append(f"{reach + 1}..{low - 1}")
            reach = max(reach, high)
        if reach < config.max_batch_size:
            gaps.append(f"{reach + 1}..{config.max_batch_size}")
        if gaps:
            listed = "profile " + ", ".join(map(str, indices))
            problems.append(
                f"{label} uses {listed} (no `profile` list means profile 0 only): "
                f"batch {', '.join(gaps)} of max_batch_size {config.max_batch_size} in none"
            )
    if named and max(ranges[i][1] for i in named) < config.max_batch_size:
        problems.append(
            f"max_batch_size {config.max_batch_size} exceeds the named profiles' largest batch "
            f"{max(ranges[i][1] for i in named)}: auto-complete refuses the model"
        )
    warmed = {b.batch_size for b in config.model_warmup}
    for i in sorted(named):
        low, high = ranges[i]
        if config.model_warmup and not any(low <= b <= high for b in warmed):
            problems.append(f"profile {i} (batch {low}..{high}) gets no warmup sample")
    cuda = config.optimization.cuda
    if cuda.graphs:
        for spec in cuda.graph_spec:
            if not any(low <= spec.batch_size <= high for low, high in ranges):
                problems.append(f"graph_spec batch {spec.batch_size} is in no profile")
            if spec.HasField("graph_lower_bound") and not spec.input:
                problems.append(
                    f"graph_spec batch {spec.batch_size}: graph_lower_bound without `input` "
                    "shapes has no effect (the graph serves only that exact batch)"
                )
    return problems


ORT_PROFILE_KEYS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")


def _parse_ort_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """``NAME:AxB,NAME2:CxD`` (onnxruntime's TensorRT profile option) → {name: shape}."""
    shapes = {}
    for item in text.split(","):
        name, dims = item.rsplit(":", 1)
        shapes[name] = tuple(int(d) for d in dims.split("x"))
    return shapes


def ort_tensorrt_problems(
    config: mc.ModelConfig, dynamic: Mapping[str, Mapping[int, tuple[int, int, int]]] = {}
) -> list[str]:
    """Whether onnxruntime's TensorRT accelerator builds its engine at load, not in a request.

    Without explicit profiles the TensorRT execution provider sizes its engine to the input
    shapes it has seen and builds it again, inside the request that brings a shape outside
    them (tens of seconds). So either the profile options (``trt_profile_min_shapes`` /
    ``_opt_`` / ``_max_``, which onnxruntime_backend r24.10 passes on: src/onnxruntime.cc:
    636-647) span batch 1..max_batch_size and the dynamic axes' ranges, or the warmup holds
    both corners: batch 1 at the smallest shape and max_batch_size at the largest.

    Args:
        config: a config with the ``tensorrt`` GPU execution accelerator (else: no problems).
        dynamic: ranges of the non-batch dynamic axes, as for ``profiles_for``.
    """
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    tensorrt = next((a for a in accelerators if a.name == "tensorrt"), None)
    if tensorrt is None:
        return []
    profiles = profiles_for(
        mc.ModelConfig(
            max_batch_size=config.max_batch_size, input=config.input
        ),  # one range: 1..max_batch_size
        dynamic,
    )
    (whole,) = profiles
    lowest = {name: shapes.min for name, shapes in whole.items()}
    highest = {name: shapes.max for name, shapes in whole.items()}
    given = [k for k in ORT_PROFILE_KEYS if k in tensorrt.parameters]
    if given:
        if len(given) != len(ORT_PROFILE_KEYS):
            return [f"give all of {ORT_PROFILE_KEYS}, not only {given}"]
        low = _parse_ort_shapes(tensorrt.parameters["trt_profile_min_shapes"])
        high = _parse_ort_shapes(tensorrt.parameters["trt_profile_max_shapes"])
        problems = []
        if low != lowest:
            problems.append(f"trt_profile_min_shapes {low} ≠ the smallest accepted {lowest}")
        if high != highest:
            problems.append(f"trt_profile_max_shapes {high} ≠ the largest accepted {highest}")
        return problems
    samples = [
        {name: (w.batch_size, *w.inputs[name].dims) for name in lowest if name in w.inputs}
        for w in config.model_warmup
    ]
    missing = [
        label
        for label, corner in (("smallest", lowest), ("largest", highest))
        if corner not in samples
    ]
    if missing:
        return [
            f"no profile options and no warmup at the {' and '.join(missing)} shape "
            f"({lowest} .. {highest}): the engine is rebuilt inside a request"
        ]
    return []


def planned_spec(config: mc.ModelConfig, profiles: list[Profile]) -> EngineSpec:
    """The EngineSpec a build with ``profiles`` should produce, to check it before building."""
    return EngineSpec(
        inputs={t.name: (-1, *t.dims) for t in config.input},
        outputs={t.name: (-1, *t.dims) for t in config.output},
        profiles=profiles,
    )


# trtexec -----------------------------------------------------------------------------------------
def trtexec_command(
    onnx: Path,
    plan: Path,
    profiles: Sequence[Profile],
    precision: str = "fp16",
    workspace_mib: int = DEFAULT_WORKSPACE_MIB,
    timing_cache: Path | None = None,
    strongly_typed: bool = False,
) -> list[str]:
    """The ``trtexec`` command (TensorRT 10 flags) that builds the same engine as ``build``.

    Explicit batch is the only mode in TensorRT 10, so there is no ``--explicitBatch``; each
    profile repeats ``--minShapes/--optShapes/--maxShapes``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}")
    cmd = ["trtexec", f"--onnx={onnx}", f"--saveEngine={plan}"]
    for profile in profiles:
        parts = [shapes.as_trtexec(name) for name, shapes in profile.items()]
        for flag, index in (("--minShapes", 0), ("--optShapes", 1), ("--maxShapes", 2)):
            cmd.append(f"{flag}={','.join(p[index] for p in parts)}")
    if strongly_typed:
        cmd.append("--stronglyTyped")
    elif precision == "fp16":
        cmd.append("--fp16")
    elif precision == "int8":
        cmd += ["--fp16", "--int8"]  # Q/DQ layers run INT8, the rest may use FP16
    cmd.append(f"--memPoolSize=workspace:{workspace_mib}M")
    if timing_cache is not None:
        cmd.append(f"--timingCacheFile={timing_cache}")
    return cmd


# TensorRT itself ---------------------------------------------------------------------------------
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


def _engine(plan: Path):
    trt = load_tensorrt()
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(plan.read_bytes())
    if engine is None:
        raise RuntimeError(f"{plan} is not an engine for this GPU and TensorRT version")
    return trt, engine


def read_engine(plan: Path) -> EngineSpec:
    """An engine's inputs, outputs, dtypes and optimization profiles, read from the plan."""
    trt, engine = _engine(plan)
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


def run_engine(plan: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an engine once on the GPU (first profile that fits), with torch CUDA buffers."""
    import torch

    _, engine = _engine(plan)
    spec = read_engine(plan)
    batch = len(next(iter(feeds.values())))
    index = next(
        i
        for i, p in enumerate(spec.profiles)
        if all(s.min[0] <= batch <= s.max[0] for s in p.values())
    )
    context = engine.create_execution_context()
    stream = torch.cuda.Stream()
    context.set_optimization_profile_async(index, stream.cuda_stream)
    buffers = {}
    for name, array in feeds.items():
        buffers[name] = torch.from_numpy(np.ascontiguousarray(array)).cuda()
        context.set_input_shape(name, tuple(array.shape))
        context.set_tensor_address(name, buffers[name].data_ptr())
    for name in spec.outputs:
        shape = tuple(context.get_tensor_shape(name))
        dtype = getattr(torch, np.dtype(spec.dtypes[name]).name)
        buffers[name] = torch.empty(shape, dtype=dtype, device="cuda")
        context.set_tensor_address(name, buffers[name].data_ptr())
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError(f"{plan}: execution failed")
    stream.synchronize()
    return {name: buffers[name].cpu().numpy() for name in spec.outputs}


def parity(recipe: Recipe, repository: Path, plan: Path):
    """Compare the engine with the fp32 model on onnxruntime (CPU) on real inputs.

    Classifier: the sample photos, FP16 logit tolerance and top-1 agreement. Encoder: sample
    texts (short and long), cosine of the sentence embeddings (pooled inside both graphs).

    Raises:
        RuntimeError: outside the tolerance.
    """
    from export import onnx_export
    from pipelines import onnx_runner

    reference = recipe.reference_path(repository)
    if recipe.model == embedding.ENCODER:
        from export.minilm import parity_texts

        ids, mask = embedding.tokenize(parity_texts())
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        names = [embedding.EMBEDDING]
    else:
        from export.efficientnet_lite0 import photos_batch

        feeds = {classification.PIXELS: photos_batch()}
        names = [classification.LOGITS]
    session = onnx_runner.create_session(reference, intra_op_threads=2)
    expected = onnx_runner.run(session, feeds, names)[0]
    got = run_engine(plan, feeds)[names[0]]
    report = onnx_export.compare(expected, got)
    floor = INT8_MIN_COSINE if recipe.precision == "int8" else FP16_MIN_COSINE
    ok = report.cosine_min >= floor
    if recipe.model == classification.CLASSIFIER:
        ok = ok and report.ok(FP16_LOGIT_ATOL)
    log.info("%s/%s %s vs onnxruntime: %s", recipe.model, recipe.version, recipe.precision, report)
    if not ok:
        raise RuntimeError(f"{plan} parity failed: {report}")
    return report
