"""Every config held to its model's signature, in every variant.

The signatures are written once per service (``pipelines.classification.SIGNATURES``,
``pipelines.embedding.SIGNATURES``), and for a model ``python -m export torch`` made, in its
folder's ``signature.json``: a config whose inputs or outputs drift from them (a name,
a datatype, a dimension, an optional flag, a tensor added or left out) is reported here, by
``python -m model_config`` (``make models``) and ``--check``, before any server loads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from tritonclient.grpc import model_config_pb2 as mc

import model_config
from pipelines import classification, embedding
from pipelines.tensors import Signature, Tensor

SIGNATURES: dict[str, Signature] = {**classification.SIGNATURES, **embedding.SIGNATURES}
# A generated model's signature, beside its config (export.model_files writes it).
GENERATED = "signature.json"


def _described(tensor: Tensor, is_input: bool) -> str:
    optional = is_input and tensor.optional  # an output is always there
    return f"{tensor.config_type} {list(tensor.dims)}" + (" optional" if optional else "")


def _configured(tensor: mc.ModelInput | mc.ModelOutput, is_input: bool) -> str:
    data_type = mc.DataType.Name(tensor.data_type)
    optional = is_input and tensor.optional
    return f"{data_type} {list(tensor.dims)}" + (" optional" if optional else "")


def _compare(
    kind: str,
    expected: Iterable[Tensor],
    actual: RepeatedCompositeFieldContainer,
) -> list[str]:
    want = {t.name: _described(t, kind == "input") for t in expected}
    have = {t.name: _configured(t, kind == "input") for t in actual}
    problems = [
        f"{kind} {name}: missing (the signature has {want[name]})"
        for name in want.keys() - have.keys()
    ]
    problems += [f"{kind} {name}: not in the signature" for name in have.keys() - want.keys()]
    problems += [
        f"{kind} {name}: {have[name]}, the signature says {want[name]}"
        for name in want.keys() & have.keys()
        if have[name] != want[name]
    ]
    return sorted(problems)


def problems(config: mc.ModelConfig, signature: Signature) -> list[str]:
    """How ``config``'s inputs and outputs differ from ``signature`` (empty when they match)."""
    return _compare("input", signature.inputs, config.input) + _compare(
        "output", signature.outputs, config.output
    )


def signature_of(model_dir: Path) -> Signature | None:
    """The model's signature: its signature.json's, else its service's; None if it has neither."""
    path = model_dir / GENERATED
    if not path.is_file():
        return SIGNATURES.get(model_dir.name)
    data = json.loads(path.read_text())

    def tensors(items) -> tuple[Tensor, ...]:
        return tuple(
            Tensor(i["name"], i["datatype"], tuple(i["dims"]), i.get("optional", False))
            for i in items
        )

    return Signature(tensors(data["inputs"]), tensors(data["outputs"]))


def ranges_of(data: dict) -> dict[str, dict[int, tuple[int, int, int]]]:
    """A signature.json's dynamic axes: input → {axis in the batched shape: (min, opt, max)}."""
    return {
        name: {int(axis): tuple(r) for axis, r in axes.items()}
        for name, axes in data.get("ranges", {}).items()
    }


def check_repository(repository: Path) -> list[str]:
    """Every model's config.pbtxt and every variant, held to its signature; one line a problem.

    Variants are rendered from their overlays here, so a stale rendered file does not hide a
    drifted overlay (``model_config.stale`` reports those).
    """
    found = []
    for model_dir in model_config.model_dirs(repository):
        signature = signature_of(model_dir)
        if signature is None:
            found.append(f"{model_dir}: no signature for this model in pipelines/ or {GENERATED}")
            continue
        configs = [(model_config.BASE, model_config.parse(model_dir / model_config.BASE))]
        configs += [
            (
                model_config.overlay_path(model_dir, name).relative_to(model_dir),
                model_config.render(model_dir, name),
            )
            for name in model_config.variant_names(model_dir)
        ]
        for source, config in configs:
            found += [f"{model_dir.name}/{source}: {p}" for p in problems(config, signature)]
    return found
