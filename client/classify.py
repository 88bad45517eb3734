"""Client of the ``classify`` ensemble: image files in, top-k ImageNet labels out.

Example:
    with ClassifyClient("localhost:8001", protocol="grpc") as client:
        for prediction in client.classify([open("cat.jpg", "rb").read()], top_k=3):
            print(prediction.labels, prediction.scores)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from client import connection
from pipelines import classification

OUTPUTS = (classification.LABELS, classification.SCORES, classification.CLASS_IDS)


@dataclass(frozen=True)
class Prediction:
    """Top-k classes of one image, most probable first."""

    labels: list[str]
    scores: list[float]
    class_ids: list[int]


def build_inputs(mod, images: Sequence[bytes], top_k: int | None) -> list:
    """InferInputs for a batch of encoded images (binary tensor data over HTTP)."""
    if not images:
        raise connection.ClientError("no images given")
    batch = np.array([bytes(b) for b in images], dtype=np.object_).reshape(-1, 1)
    inputs = [connection.make_input(mod, classification.IMAGE, batch, "BYTES")]
    if top_k is not None:
        k = np.full((len(images), 1), top_k, np.int32)
        inputs.append(connection.make_input(mod, classification.TOP_K, k, "INT32"))
    return inputs


def parse(result) -> list[Prediction]:
    """Predictions from an InferResult (HTTP or gRPC)."""
    labels = result.as_numpy(classification.LABELS)
    scores = result.as_numpy(classification.SCORES)
    ids = result.as_numpy(classification.CLASS_IDS)
    return [
        Prediction(
            [x.decode() if isinstance(x, bytes) else str(x) for x in row_labels],
            [float(s) for s in row_scores],
            [int(i) for i in row_ids],
        )
        for row_labels, row_scores, row_ids in zip(labels, scores, ids, strict=True)
    ]


class ClassifyClient(connection.ModelClient):
    """Synchronous client (HTTP or gRPC); a context manager that closes its connection."""

    default_model = classification.ENSEMBLE

    def classify(self, images: Sequence[bytes], top_k: int | None = None) -> list[Prediction]:
        """Classify encoded images (one request; up to the model's max_batch_size)."""
        inputs = build_inputs(self.mod, images, top_k)
        return parse(self.infer(inputs, connection.make_outputs(self.mod, OUTPUTS)))


class AsyncClassifyClient(connection.AsyncModelClient):
    """asyncio client (``tritonclient.http.aio`` / ``tritonclient.grpc.aio``)."""

    default_model = classification.ENSEMBLE

    async def classify(self, images: Sequence[bytes], top_k: int | None = None) -> list[Prediction]:
        """Classify encoded images in one request."""
        inputs = build_inputs(self.mod, images, top_k)
        return parse(await self.infer(inputs, connection.make_outputs(self.mod, OUTPUTS)))
