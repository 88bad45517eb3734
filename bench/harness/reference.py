"""In-process reference of the ``classify`` ensemble: the same functions, no server.

Tests compare the served results with this; benchmarks use it as the raw-engine baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipelines import classification, image, imagenet, onnx_runner


class ReferenceClassifier:
    """preprocess → onnxruntime → top-k, exactly as the served steps compute them."""

    def __init__(self, onnx_path: Path | str, intra_op_threads: int = 2):
        self.session = onnx_runner.create_session(onnx_path, intra_op_threads=intra_op_threads)

    def logits(self, pixels: np.ndarray) -> np.ndarray:
        """Raw classifier output for a preprocessed batch."""
        return onnx_runner.run(
            self.session, {classification.PIXELS: pixels}, [classification.LOGITS]
        )[0]

    def classify(
        self, images: Sequence[bytes], top_k: int = classification.DEFAULT_TOP_K
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(labels bytes [n, k], scores [n, k], class ids [n, k]) for encoded images.

        Raises:
            image.ImageError: an image cannot be decoded (the first failure).
        """
        pixels, errors = image.preprocess_batch(images)
        for err in errors:
            if err is not None:
                raise err
        ids, scores = imagenet.top_k(self.logits(pixels), top_k)
        return imagenet.label_names(ids), scores, ids
