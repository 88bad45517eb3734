"""Build TensorRT engines (``model.plan``) from the repository's ONNX models, TensorRT 10 API.

Engines are specific to the GPU model and the TensorRT version, so they are built on the target
machine (the container's entrypoint does it at first start, ``server/container.py``), never
committed. Everything an engine must agree with comes from the model's Triton config
(``configs/gpu.pbtxt``): the optimization profiles cover batch 1 up to ``max_batch_size``, one
profile per batch range ending at a preferred batch size (the sizes the dynamic batcher forms
under load), each optimized (``opt``) for that preferred size; the encoder's sequence axis spans
the tokenizer's padding buckets.

One module per job:

* ``profiles``: the recipes (which ONNX file, precision, dynamic axes) and the optimization
  profiles read from a config;
* ``checks``: whether a config and an engine (or onnxruntime's TensorRT accelerator) agree;
* ``trtexec``: the equivalent ``trtexec`` command line;
* ``builder``: building with the TensorRT Python API, the fingerprint a cached plan is checked
  against, reading a plan back;
* ``verify``: parity of a built engine with the fp32 model on onnxruntime.

What needs no GPU (profiles, the ``trtexec`` command, config/engine consistency) is plain Python
and unit-tested everywhere; building, reading back and the parity check run where TensorRT and a
GPU are present and say why they are skipped otherwise. Callers use this package's names
(``tensorrt.recipes()``, ``tensorrt.build(...)``), not the modules'.
"""

from export.tensorrt.builder import (
    build,
    deserialize,
    fingerprint,
    fp16_onnx,
    load_tensorrt,
    major_version,
    read_engine,
    unavailable_reason,
)
from export.tensorrt.checks import (
    ORT_PROFILE_KEYS,
    TRITON_DTYPES,
    backend_problems,
    check_engine,
    ort_tensorrt_problems,
    planned_spec,
)
from export.tensorrt.profiles import (
    DEFAULT_WORKSPACE_MIB,
    PRECISIONS,
    EngineSpec,
    Profile,
    Recipe,
    Shapes,
    batch_ranges,
    profiles_for,
    recipes,
    sequence_range,
)
from export.tensorrt.trtexec import trtexec_command
from export.tensorrt.verify import (
    FP16_LOGIT_ATOL,
    FP16_MIN_COSINE,
    INT8_MIN_COSINE,
    parity,
    run_engine,
)

__all__ = [
    "DEFAULT_WORKSPACE_MIB",
    "FP16_LOGIT_ATOL",
    "FP16_MIN_COSINE",
    "INT8_MIN_COSINE",
    "ORT_PROFILE_KEYS",
    "PRECISIONS",
    "TRITON_DTYPES",
    "EngineSpec",
    "Profile",
    "Recipe",
    "Shapes",
    "backend_problems",
    "batch_ranges",
    "build",
    "check_engine",
    "deserialize",
    "fingerprint",
    "fp16_onnx",
    "load_tensorrt",
    "major_version",
    "ort_tensorrt_problems",
    "parity",
    "planned_spec",
    "profiles_for",
    "read_engine",
    "recipes",
    "run_engine",
    "sequence_range",
    "trtexec_command",
    "unavailable_reason",
]
