"""What a user says of a model's tensors on the command line, parsed and checked.

``NAME:DTYPE:DIMS[:LOW..HIGH]`` per input, for example ``PIXELS:fp32:3,224,224`` or
``TOKENS:int64:1..128:0..30522``:

* ``DTYPE`` is a KServe v2 datatype (``FP32``, ``INT64``...) or its numpy name (``float32``);
* ``DIMS`` are the dims of one item (Triton adds the batch axis): a number is fixed, ``MIN..MAX``
  (or ``MIN..OPT..MAX``) is a dynamic axis with the range the TensorRT profiles and the checks
  cover, ``-1`` is short for ``1..64``;
* ``LOW..HIGH`` bounds the generated values of an integer input (token ids must stay inside the
  vocabulary); the default is ``0..10``.

Everything Triton or this repository's runners would refuse is refused here, with the reason,
before anything is imported or written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from pipelines.tensors import Tensor

# KServe v2 datatype → numpy dtype, for every type an ONNX graph exported from PyTorch, Triton's
# backends and numpy clients all handle.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_ALIASES = {dtype.name.upper(): name for name, dtype in DATATYPES.items()}
_ALIASES.update(
    {"FLOAT": "FP32", "HALF": "FP16", "DOUBLE": "FP64", "LONG": "INT64", "INT": "INT32"}
)
# Why the others are refused: the message a user gets.
_REFUSED = {
    "BF16": "bfloat16 has no numpy type, so neither the clients nor the checks can send it; "
    "export in fp32 or fp16",
    "BFLOAT16": "bfloat16 has no numpy type, so neither the clients nor the checks can send it; "
    "export in fp32 or fp16",
    "BYTES": "a PyTorch graph cannot take strings; tokenize or decode in a Python step in front "
    "of it (docs/your-model.md)",
    "STRING": "a PyTorch graph cannot take strings; tokenize or decode in a Python step in front "
    "of it (docs/your-model.md)",
    "COMPLEX64": "Triton has no complex datatype",
    "COMPLEX128": "Triton has no complex datatype",
}
DEFAULT_RANGE = (1, 64, 64)  # what -1 means: a dynamic axis of 1..64, profiles optimized at 64
DEFAULT_VALUES = (0, 10)
# Triton takes any name, but these appear in file names, URLs and TensorRT profile strings.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


class SpecError(ValueError):
    """A tensor or model description Triton (or this exporter) would refuse; says why."""


@dataclass(frozen=True)
class InputSpec:
    """One input: its tensor, the ranges of its dynamic axes, the values generated for it."""

    tensor: Tensor
    # axis (1-based, in the batched shape) → (min, opt, max), for each dynamic axis
    ranges: dict[int, tuple[int, int, int]]
    values: tuple[int, int] = DEFAULT_VALUES

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype."""
        return DATATYPES[self.tensor.datatype]

    def shape(self, batch: int, pick: int) -> tuple[int, ...]:
        """The batched shape with each dynamic axis at its min (0), opt (1) or max (2)."""
        dims = [batch]
        for axis, size in enumerate(self.tensor.dims, start=1):
            dims.append(self.ranges[axis][pick] if size < 0 else size)
        return tuple(dims)

    def generate(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Values of this input's type: normal floats, integers in ``values``, random booleans."""
        if self.dtype.kind == "f":
            return rng.standard_normal(shape).astype(self.dtype)
        if self.dtype.kind == "b":
            return rng.random(shape) < 0.5
        low, high = self.values
        return rng.integers(low, high, size=shape, endpoint=False).astype(self.dtype)


def datatype(text: str) -> str:
    """The KServe v2 datatype ``text`` names; SpecError for one this exporter cannot serve."""
    key = text.strip().upper()
    if key in _REFUSED:
        raise SpecError(f"datatype {text}: {_REFUSED[key]}")
    if key in DATATYPES:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise SpecError(f"datatype {text}: not one of {', '.join(DATATYPES)}")


def datatype_of(dtype: np.dtype | str) -> str:
    """The datatype of a numpy (or torch, by name) dtype; SpecError for an unsupported one."""
    name = str(dtype).removeprefix("torch.")
    return datatype({"float": "FP32", "bfloat16": "BF16"}.get(name, name))


def check_name(name: str, what: str) -> str:
    """``name`` if it is a usable tensor or model name; SpecError otherwise."""
    if not _NAME.fullmatch(name):
        raise SpecError(
            f"{what} {name!r}: use letters, digits, '_', '.' or '-' (64 at most), "
            "starting with a letter or '_'"
        )
    return name


def _range(text: str, what: str) -> tuple[int, int, int]:
    parts = text.split("..")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise SpecError(f"{what}: {text!r} is not N, -1 or MIN..MAX") from None
    if len(values) == 2:
        values = [values[0], values[1], values[1]]
    if len(values) != 3 or not 1 <= values[0] <= values[1] <= values[2]:
        raise SpecError(f"{what}: {text!r} must be MIN..MAX or MIN..OPT..MAX with 1 <= MIN <= MAX")
    return values[0], values[1], values[2]


def parse_input(text: str) -> InputSpec:
    """``NAME:DTYPE:DIMS[:LOW..HIGH]`` → InputSpec; SpecError naming what is wrong."""
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise SpecError(f"--input {text!r}: expected NAME:DTYPE:DIMS[:LOW..HIGH]")
    name = check_name(parts[0], "input")
    kind = datatype(parts[1])
    dims, ranges = [], {}
    for axis, token in enumerate(parts[2].split(","), start=1):
        token = token.strip()
        if token == "-1":
            dims.append(-1)
            ranges[axis] = DEFAULT_RANGE
        elif ".." in token:
            dims.append(-1)
            ranges[axis] = _range(token, f"input {name} axis {axis}")
        else:
            try:
                size = int(token)
            except ValueError:
                raise SpecError(f"input {name}: dim {token!r} is not N, -1 or MIN..MAX") from None
            if size < 1:
                raise SpecError(f"input {name}: dim {size} must be >= 1 (or -1 for dynamic)")
            dims.append(size)
    values = DEFAULT_VALUES
    if len(parts) == 4:
        if DATATYPES[kind].kind not in "iu":
            raise SpecError(f"input {name}: a value range is for integer inputs only")
        low, _, high = _range_values(parts[3], name)
        values = (low, high)
    return InputSpec(Tensor(name, kind, tuple(dims)), ranges, values)


def _range_values(text: str, name: str) -> tuple[int, int, int]:
    try:
        low, high = (int(p) for p in text.split(".."))
    except ValueError:
        raise SpecError(f"input {name}: values {text!r} must be LOW..HIGH") from None
    if low >= high:
        raise SpecError(f"input {name}: values {text!r} must have LOW < HIGH (HIGH excluded)")
    return low, 0, high


def check_unique(names: list[str]) -> None:
    """SpecError when a tensor name repeats (Triton refuses such a config)."""
    seen = set()
    for name in names:
        if name in seen:
            raise SpecError(f"tensor name {name!r} is used twice")
        seen.add(name)
