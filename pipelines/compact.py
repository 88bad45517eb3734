"""A compact copy of a state dict for transport: int8, fp16 or fp32 per tensor, self-checking.

One safetensors file. The caller's rule picks each floating tensor's form: ``int8`` (weight-only,
symmetric, one fp16 scale per ``group`` consecutive values of a row), ``fp16`` or ``fp32``;
tensors that are not floating point are kept as they are. The file's metadata holds one JSON
header: each tensor's form, the group size, the sha256 of the weights the state came from, the
sha256 of what is stored (checked on every read, so a damaged or altered copy is refused) and
whatever the caller adds (the network's config, for one). ``unpack`` gives the state back in
float32, ready for ``load_state_dict``.

How close a copy stays to its source is the caller's to check on real inputs (what the network
answers, not the weights): ``export.minilm.compact`` does it for MiniLM before it writes one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

INT8, FP16, FP32 = "int8", "fp16", "fp32"
FORMS = (INT8, FP16, FP32)
KEPT = "kept"  # a tensor that is not floating point (an index, a counter): stored as it is
GROUP = 64
FORMAT = "compact-state-dict/1"
HEADER = "compact"  # the metadata key of the JSON header
SCALE = "#scale"  # suffix of an int8 tensor's scales ('#' appears in no module's parameter name)

Rule = Callable[[str, torch.Tensor], str]


class CompactError(ValueError):
    """A file that is not a compact state dict, is damaged, or comes from other weights."""


def matrices(min_elements: int, form: str = INT8, otherwise: str = FP16) -> Rule:
    """A rule: ``form`` for 2-D tensors of at least ``min_elements`` values, ``otherwise`` else.

    Large matrices hold nearly all of a transformer's bytes; biases, norms and small tables are
    a rounding error of the size and cost accuracy for nothing when quantized.
    """

    def rule(name: str, tensor: torch.Tensor) -> str:
        return form if tensor.ndim == 2 and tensor.numel() >= min_elements else otherwise

    return rule


def quantize(tensor: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one fp16 scale per ``group`` consecutive values of the last axis.

    Returns:
        (int8 values of ``tensor``'s shape, fp16 scales of shape [..., last axis / group]).

    Raises:
        ValueError: the last axis is not a multiple of ``group``.
    """
    if tensor.ndim == 0 or tensor.shape[-1] % group:
        raise ValueError(f"int8 needs a last axis that is a multiple of {group}: {tensor.shape}")
    rows = tensor.detach().float().reshape(-1, group)
    # The scale as stored (fp16) is the one the values are rounded with, so that unpacking
    # multiplies by exactly the scale they were divided by.
    scale = (rows.abs().amax(1, keepdim=True) / 127).half()
    divisor = scale.float().masked_fill(scale == 0, 1.0)
    values = torch.round(rows / divisor).clamp(-127, 127).to(torch.int8)
    return values.reshape(tensor.shape), scale.reshape(*tensor.shape[:-1], -1)


def dequantize(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of an int8 tensor and its group scales (``quantize``'s inverse)."""
    group = values.shape[-1] // scale.shape[-1]
    rows = values.float().reshape(-1, group) * scale.float().reshape(-1, 1)
    return rows.reshape(values.shape)


def _digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every stored tensor: name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{list(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def pack(
    state: Mapping[str, torch.Tensor],
    path: Path,
    rule: Rule,
    source_sha256: str,
    group: int = GROUP,
    extra: Mapping | None = None,
) -> dict:
    """Write ``state`` compactly to ``path`` (replaced whole, never left half-written).

    Args:
        state: the state dict.
        path: the safetensors file to write.
        rule: (name, tensor) → ``int8``, ``fp16`` or ``fp32`` for each floating tensor.
        source_sha256: the sha256 of the weights ``state`` was read from.
        group: values per int8 scale, along each row.
        extra: JSON-serializable facts to keep beside the weights (a network's config).

    Returns:
        The header written.

    Raises:
        ValueError: a form the rule gave that is not one of ``FORMS``, a tensor int8 cannot
            group, or a name that ends in the scales' suffix.
    """
    stored, forms = {}, {}
    for name, tensor in state.items():
        if name.endswith(SCALE):
            raise ValueError(f"{name}: a name may not end in {SCALE!r}")
        if not tensor.is_floating_point():
            stored[name], forms[name] = tensor.detach().contiguous(), KEPT
            continue
        form = rule(name, tensor)
        if form not in FORMS:
            raise ValueError(f"{name}: the rule chose {form!r}, not one of {', '.join(FORMS)}")
        if form == INT8:
            try:
                stored[name], stored[name + SCALE] = quantize(tensor, group)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        else:
            dtype = torch.float16 if form == FP16 else torch.float32
            stored[name] = tensor.detach().to(dtype).contiguous()
        forms[name] = form
    header = {
        "format": FORMAT,
        "group": group,
        "source_sha256": source_sha256,
        "content_sha256": _digest(stored),
        "forms": forms,
        "extra": dict(extra or {}),
    }
    path = Path(path)
    staged = path.with_name(f".{path.name}.partial")
    save_file(stored, str(staged), metadata={HEADER: json.dumps(header)})
    os.replace(staged, path)
    return header


def read_header(path: Path) -> dict:
    """The JSON header of a compact file (nothing else is read).

    Raises:
        CompactError: not a compact state dict of this format.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same answer
        raise CompactError(f"{path}: not a safetensors file ({exc})") from None
    if HEADER not in metadata:
        raise CompactError(f"{path}: a safetensors file without a compact header")
    header = json.loads(metadata[HEADER])
    if header.get("format") != FORMAT:
        raise CompactError(f"{path}: format {header.get('format')!r}, expected {FORMAT!r}")
    return header


def unpack(path: Path, source_sha256: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict of a compact file: floating tensors as float32, the others as stored.

    Args:
        path: the file ``pack`` wrote.
        source_sha256: if given, the weights the copy must have been made from.

    Raises:
        CompactError: not a compact file, stored tensors that differ from what was written, or
            a copy of other weights than ``source_sha256``.
    """
    header = read_header(path)
    if source_sha256 is not None and header["source_sha256"] != source_sha256:
        raise CompactError(
            f"{path}: a copy of weights with sha256 {header['source_sha256']}, "
            f"not of {source_sha256}"
        )
    stored = load_file(str(path))
    if _digest(stored) != header["content_sha256"]:
        raise CompactError(f"{path}: its tensors do not match its header's sha256 (damaged?)")
    state = {}
    for name, form in header["forms"].items():
        if form == INT8:
            state[name] = dequantize(stored[name], stored[name + SCALE])
        elif form == KEPT:
            state[name] = stored[name]
        else:
            state[name] = stored[name].float()
    return state
