"""The ``trtexec`` command line (TensorRT 10 flags) that builds the same engine as ``build``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from export.tensorrt.profiles import DEFAULT_WORKSPACE_MIB, PRECISIONS, Profile


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
