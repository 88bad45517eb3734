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
from tritonclient.utils import InferenceServerException

from client import connection
from pipelines import classification as spec


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
    image = mod.InferInput(spec.IMAGE, list(batch.shape), "BYTES")
    inputs = [image]
    if top_k is not None:
        inputs.append(mod.InferInput(spec.TOP_K, [len(images), 1], "INT32"))
    arrays = [batch] + ([np.full((len(images), 1), top_k, np.int32)] if top_k else [])
    for tensor, array in zip(inputs, arrays, strict=True):
        if mod.__name__.startswith("tritonclient.http"):
            tensor.set_data_from_numpy(array, binary_data=True)
        else:
            tensor.set_data_from_numpy(array)
    return inputs


def requested_outputs(mod) -> list:
    """Ask for every output; binary over HTTP to skip JSON encoding of the scores."""
    names = (spec.LABELS, spec.SCORES, spec.CLASS_IDS)
    if mod.__name__.startswith("tritonclient.http"):
        return [mod.InferRequestedOutput(n, binary_data=True) for n in names]
    return [mod.InferRequestedOutput(n) for n in names]


def parse(result) -> list[Prediction]:
    """Predictions from an InferResult (HTTP or gRPC)."""
    labels = result.as_numpy(spec.LABELS)
    scores = result.as_numpy(spec.SCORES)
    ids = result.as_numpy(spec.CLASS_IDS)
    return [
        Prediction(
            [x.decode() if isinstance(x, bytes) else str(x) for x in row_labels],
            [float(s) for s in row_scores],
            [int(i) for i in row_ids],
        )
        for row_labels, row_scores, row_ids in zip(labels, scores, ids, strict=True)
    ]


class ClassifyClient:
    """Synchronous client (HTTP or gRPC); a context manager that closes its connection."""

    def __init__(self, url: str | None = None, protocol: str = "http", model: str = spec.ENSEMBLE):
        self.protocol = protocol
        self.url = url or connection.default_url(protocol)
        self.model = model
        self._mod = connection.module(protocol)
        self._client = self._mod.InferenceServerClient(self.url)

    def check_ready(self) -> None:
        """Raise ClientError unless the server answers and the model is ready."""
        try:
            live = self._client.is_server_live()
        except Exception as exc:  # noqa: BLE001 - connection errors differ per protocol
            raise connection.describe_unreachable(self.url, self.protocol, exc) from None
        if not live or not self._client.is_model_ready(self.model):
            raise connection.ClientError(
                f"Triton at {self.url} is up but model '{self.model}' is not ready"
            )

    def classify(self, images: Sequence[bytes], top_k: int | None = None) -> list[Prediction]:
        """Classify encoded images (one request; up to the model's max_batch_size)."""
        inputs = build_inputs(self._mod, images, top_k)
        try:
            result = self._client.infer(self.model, inputs, outputs=requested_outputs(self._mod))
        except InferenceServerException as exc:
            raise connection.infer_error(self.model, exc) from None
        return parse(result)

    def close(self) -> None:
        """Close the connection."""
        self._client.close()

    def __enter__(self) -> ClassifyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClassifyClient:
    """asyncio client (``tritonclient.http.aio`` / ``tritonclient.grpc.aio``)."""

    def __init__(self, url: str | None = None, protocol: str = "http", model: str = spec.ENSEMBLE):
        self.protocol = protocol
        self.url = url or connection.default_url(protocol)
        self.model = model
        self._mod = connection.module(protocol, asyncio=True)
        self._client = self._mod.InferenceServerClient(self.url)

    async def check_ready(self) -> None:
        """Raise ClientError unless the server answers and the model is ready."""
        try:
            live = await self._client.is_server_live()
        except Exception as exc:  # noqa: BLE001
            raise connection.describe_unreachable(self.url, self.protocol, exc) from None
        if not live or not await self._client.is_model_ready(self.model):
            raise connection.ClientError(
                f"Triton at {self.url} is up but model '{self.model}' is not ready"
            )

    async def classify(self, images: Sequence[bytes], top_k: int | None = None) -> list[Prediction]:
        """Classify encoded images in one request."""
        inputs = build_inputs(self._mod, images, top_k)
        try:
            result = await self._client.infer(
                self.model, inputs, outputs=requested_outputs(self._mod)
            )
        except InferenceServerException as exc:
            raise connection.infer_error(self.model, exc) from None
        return parse(result)

    async def close(self) -> None:
        """Close the connection."""
        await self._client.close()

    async def __aenter__(self) -> AsyncClassifyClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
