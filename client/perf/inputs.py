"""perf_analyzer ``--input-data`` files made from real photos, one per model."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np

from pipelines import classification as spec
from pipelines import image, samples


def _string_element(data: bytes) -> str:
    # perf_analyzer wants a BYTES element in Triton's serialized form: 4-byte LE length + bytes.
    return base64.b64encode(struct.pack("<I", len(data)) + data).decode()


def _tensor(array: np.ndarray) -> dict:
    return {
        "b64": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode(),
        "shape": list(array.shape),
    }


def entries(model: str, reference=None) -> list[dict]:
    """One perf_analyzer data entry per sample photo, for the given model's inputs.

    Args:
        model: ensemble or step name from pipelines.classification.
        reference: a ReferenceClassifier, needed only for postprocess inputs (real logits).
    """
    photos = [samples.photo_bytes(name) for name in samples.PHOTOS]
    if model in (spec.ENSEMBLE, spec.PREPROCESS):
        return [{spec.IMAGE: {"b64": _string_element(p), "shape": [1]}} for p in photos]
    pixels, _ = image.preprocess_batch(photos)
    if model == spec.CLASSIFIER:
        return [{spec.PIXELS: _tensor(px)} for px in pixels]
    if model == spec.POSTPROCESS:
        if reference is None:
            raise ValueError("postprocess inputs need a reference classifier for real logits")
        return [{spec.LOGITS: _tensor(row)} for row in reference.logits(pixels)]
    raise KeyError(f"no perf inputs for model {model!r}")


def json_entries(model: str) -> list[dict]:
    """Entries with plain JSON numbers (``--input-tensor-format json`` and the peer server)."""
    if model != spec.CLASSIFIER:
        raise KeyError("JSON payloads are made for the classifier only")
    pixels, _ = image.preprocess_batch([samples.photo_bytes(n) for n in samples.PHOTOS])
    return [
        {spec.PIXELS: {"content": px.reshape(-1).round(5).tolist(), "shape": list(px.shape)}}
        for px in pixels
    ]


def write(model: str, directory: Path, reference=None, as_json: bool = False) -> Path:
    """Write ``<model>[-json].json`` into ``directory`` and return its path."""
    data = json_entries(model) if as_json else entries(model, reference)
    path = directory / f"{model}{'-json' if as_json else ''}.json"
    path.write_text(json.dumps({"data": data}))
    return path
