"""A stand-in for the Python backend's ``triton_python_backend_utils``, for unit tests.

Only the API the python_backend README documents and this repository's models use: tensors
(numpy or DLPack), requests with cancellation, responses with errors. Tests put this folder on
``sys.path`` (``tests/unit/conftest.py``) and import model code as the stub would.
"""

from __future__ import annotations

import numpy as np


class TritonError:
    """An error for one response (``InferenceResponse(error=...)``)."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(7)
    CANCELLED = 7

    def __init__(self, message: str, code: int = 0):
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):  # noqa: N818 - the real module's name
    """Raised by a model to fail the whole batch."""


class Tensor:
    """A named tensor; ``dlpack_source`` is what ``from_dlpack`` was given (tests inspect it)."""

    def __init__(self, name: str, array, dlpack_source=None):
        self._name = name
        self._array = array
        self.dlpack_source = dlpack_source

    @classmethod
    def from_dlpack(cls, name: str, tensor) -> Tensor:
        # As the stub does (python_backend src/pb_tensor.cc FromDLPack): a capsule, or an object
        # with __dlpack__ and __dlpack_device__.
        if not (hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__")):
            if type(tensor).__name__ != "PyCapsule":
                raise TypeError("a DLPack capsule or an object with __dlpack__ is needed")
            import torch

            return cls(name, torch.from_dlpack(tensor).cpu().numpy(), tensor)
        return cls(name, np.from_dlpack(tensor.cpu()) if hasattr(tensor, "cpu") else tensor, tensor)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return np.asarray(self._array)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self):
        return np.asarray(self._array).__dlpack__()


class InferenceRequest:
    """A request: named input tensors, and whether its client cancelled it."""

    def __init__(self, inputs: list[Tensor], cancelled: bool = False):
        self._inputs = {t.name(): t for t in inputs}
        self._cancelled = cancelled

    def inputs(self) -> list[Tensor]:
        return list(self._inputs.values())

    def is_cancelled(self) -> bool:
        return self._cancelled


class InferenceResponse:
    """A response: output tensors, or an error."""

    def __init__(
        self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None
    ):
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request._inputs.get(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


class MetricFamily:
    """A custom metric family; its series record what they were given (``value``)."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, name: str, description: str, kind: str):
        self.name, self.description, self.kind = name, description, kind
        self.series: list[Metric] = []

    def Metric(self, labels: dict, buckets: list | None = None) -> Metric:  # noqa: N802 - real API
        metric = Metric(labels, buckets)
        self.series.append(metric)
        return metric


class Metric:
    """One series: counters and gauges keep a value, histograms their observations."""

    def __init__(self, labels: dict, buckets: list | None = None):
        self.labels, self.buckets = labels, buckets
        self.value, self.observed = 0.0, []

    def increment(self, value: float) -> None:
        self.value += value

    def set(self, value: float) -> None:
        self.value = value

    def observe(self, value: float) -> None:
        self.observed.append(value)
