"""Whether a Triton config and an engine (or onnxruntime's TensorRT accelerator) agree.

Plain Python on the config and the engine's spec (``planned_spec`` before a build,
``read_engine`` after), so it runs everywhere, GPU or not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from export.tensorrt.profiles import EngineSpec, Profile, profiles_for

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
