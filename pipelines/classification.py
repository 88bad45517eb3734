"""The image-classification service's contract (EfficientNet-Lite0): its models and tensors.

Model names, tensor names, types and input geometry are written here once; export/, the configs
(held to ``SIGNATURES`` by ``python -m model_config --check``), the Python-backend steps, the
clients and the tests read them from here. Post-processing lives in ``pipelines.imagenet``.
"""

from __future__ import annotations

from pipelines.tensors import Signature, Tensor

# Models in model_repository/.
ENSEMBLE = "classify"
PREPROCESS = "preprocess"
CLASSIFIER = "classifier"
POSTPROCESS = "postprocess"
# The same pipeline in one Python step, for the CPU (beside the ensemble, same contract).
FUSED = "classify_fused"
# What clients call; the other models are steps of these, which the gateway does not pass on.
SERVED = (ENSEMBLE, FUSED)

# Tensor names, after what they hold; their types and dims are in SIGNATURES.
IMAGE = "IMAGE"  # one encoded image (JPEG, PNG, WebP, ...) per batch item
# RGB 0-255, NCHW. The classifier normalizes them as its first layers: a quarter of float32's
# bytes between the steps, and every runtime of the model (onnxruntime, TensorRT, PyTorch)
# normalizes alike.
PIXELS = "PIXELS"
LOGITS = "LOGITS"
TOP_K = "TOP_K"  # optional: how many classes to return (default DEFAULT_TOP_K)
LABELS = "LABELS"  # k class names
SCORES = "SCORES"  # softmax probabilities, descending
CLASS_IDS = "CLASS_IDS"  # ImageNet-1k class indices

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

_IMAGE = Tensor(IMAGE, "BYTES", (1,))
_PIXELS = Tensor(PIXELS, "UINT8", (CHANNELS, IMAGE_SIZE, IMAGE_SIZE))
_LOGITS = Tensor(LOGITS, "FP32", (NUM_CLASSES,))
_TOP_K = Tensor(TOP_K, "INT32", (1,), optional=True)
_TOP = (
    Tensor(LABELS, "BYTES", (-1,)),
    Tensor(SCORES, "FP32", (-1,)),
    Tensor(CLASS_IDS, "INT32", (-1,)),
)
_CLASSIFY = Signature((_IMAGE, _TOP_K), _TOP)

# Each model's inputs and outputs, in every config variant.
SIGNATURES = {
    PREPROCESS: Signature((_IMAGE,), (_PIXELS,)),
    CLASSIFIER: Signature((_PIXELS,), (_LOGITS,)),
    POSTPROCESS: Signature((_LOGITS, _TOP_K), _TOP),
    ENSEMBLE: _CLASSIFY,
    FUSED: _CLASSIFY,  # the same pipeline in one step
}
