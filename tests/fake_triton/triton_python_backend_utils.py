"""A stand-in for the Python backend's ``triton_python_backend_utils``, for unit tests.

Only the API the python_backend README documents and this repository's models use: tensors
(numpy or DLPack, on the CPU or flagged as on a GPU), requests with cancellation, responses with
errors, custom metrics. Tests put this folder on ``sys.path`` (``tests/unit/conftest.py``) and
import model code as the stub would.

Each behaviour our code depends on follows the real module, and its comment names where
python_backend r24.10 defines it (``src/pb_stub.cc`` binds the C++ classes into the module
``c_python_backend_utils``, which ``src/resources/triton_python_backend_utils.py`` re-exports).
"""

from __future__ import annotations

import numpy as np

# DLPack device types (dlpack.h DLDeviceType), as PbTensor::DeviceType maps memory types.
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3


class TritonModelException(Exception):  # noqa: N818 - the real module's name
    """What the stub raises into Python for a PythonBackendException, and what fails a batch.

    python_backend r24.10 src/pb_stub.cc: ``py::register_exception<PythonBackendException>(
    module, "TritonModelException")``, so every C++-side refusal below raises this type.
    """


class TritonError:
    """An error for one response (``InferenceResponse(error=...)``)."""

    # python_backend r24.10 src/pb_stub.cc (TritonError binding): the codes are
    # TRITONSERVER_Error_Code's values, in tritonserver.h's order, CANCELLED last.
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(7)
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL):
        # python_backend r24.10 src/pb_stub.cc: py::arg("message").none(false) and
        # py::arg("code").none(false) = TRITONSERVER_ERROR_INTERNAL; src/pb_error.h: PbError's
        # code defaults to TRITONSERVER_ERROR_INTERNAL. So no code means INTERNAL (HTTP 500).
        if message is None or code is None:
            raise TypeError("TritonError(message, code): neither may be None")
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    """A named tensor in CPU memory (numpy) or, from ``from_dlpack``, on a GPU.

    ``dlpack_source`` is what ``from_dlpack`` was given (tests inspect it).
    """

    def __init__(self, name: str, array, dlpack_source=None):
        # python_backend r24.10 src/pb_tensor.cc PbTensor::PbTensor(name, numpy_array): an empty
        # name is refused; a non-C-contiguous array is copied with numpy.ascontiguousarray;
        # the memory type is CPU.
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        self._name = name
        self._array = None if array is None else np.ascontiguousarray(array)
        self._device = (KDL_CPU, 0)
        self.dlpack_source = dlpack_source

    @classmethod
    def from_dlpack(cls, name: str, tensor) -> Tensor:
        """A tensor from a DLPack capsule or an object with ``__dlpack__``/``__dlpack_device__``."""
        # python_backend r24.10 src/pb_tensor.cc PbTensor::FromDLPack: a capsule, or an object
        # with both attributes (else refused); kDLCUDA stays GPU memory (is_cpu() is False),
        # kDLCPU and kDLCUDAHost become CPU memory, any other device type is refused.
        # FromDLPackCapsule refuses a tensor that is not C-contiguous.
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        if type(tensor).__name__ == "PyCapsule":
            import torch

            return cls(name, torch.from_dlpack(tensor).numpy(), tensor)
        if not (hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__")):
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                "`__dlpack__` and `__dlpack_device__` attributes"
            )
        device_type, device_id = tensor.__dlpack_device__()
        if device_type == KDL_CUDA:
            if hasattr(tensor, "is_contiguous") and not tensor.is_contiguous():
                raise TritonModelException("DLPack tensor is not contiguous.")
            made = cls(name, None, tensor)
            made._device = (KDL_CUDA, int(device_id))
            return made
        if device_type not in (KDL_CPU, KDL_CUDA_HOST):
            raise TritonModelException(
                f"DLDevice type {device_type} is not support by Python backend."
            )
        array = np.from_dlpack(tensor)
        if not array.flags.c_contiguous:
            raise TritonModelException("DLPack tensor is not contiguous.")
        return cls(name, array, tensor)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        # python_backend r24.10 src/pb_tensor.cc PbTensor::AsNumpy: refused for GPU memory.
        if not self.is_cpu():
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array

    def is_cpu(self) -> bool:
        # python_backend r24.10 src/pb_tensor.cc PbTensor::IsCPU: CPU or CPU_PINNED memory.
        return self._device[0] == KDL_CPU

    def to_dlpack(self):
        # python_backend r24.10 src/pb_tensor.cc PbTensor::ToDLPack: a capsule over the tensor's
        # own memory (no copy), on its own device; string (BYTES) tensors are refused.
        if not self.is_cpu():
            return self.dlpack_source.__dlpack__()
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not have support for string tensors.")
        return self._array.__dlpack__()


# BLS: what a model sees when it calls another model (``InferenceRequest(model_name=...)
# .exec()``): model name → a function of the request that returns its response. Tests set it.
BLS_MODELS: dict = {}


class InferenceTrace:
    """A request's trace (python_backend r24.10 pb_utils.InferenceTrace).

    ``get_context()`` is its OpenTelemetry context as JSON, ``{"traceparent": "00-..."}``, where
    the server traces the request in OpenTelemetry mode; here the context the test gave.
    """

    def __init__(self, context: str | None):
        self._context = context

    def get_context(self) -> str | None:
        return self._context


class InferenceRequest:
    """A request: named input tensors, and whether its client cancelled it.

    Built with ``model_name`` it is a BLS request, which ``exec()`` hands to BLS_MODELS.
    """

    def __init__(
        self,
        inputs: list[Tensor] | None = None,
        cancelled: bool = False,
        *,
        model_name: str | None = None,
        model_version: int = -1,
        requested_output_names: list[str] | None = None,
        trace_context: str | None = None,
    ):
        self._trace = InferenceTrace(trace_context)
        self._inputs = list(inputs or [])
        self._cancelled = cancelled
        self.model_name, self.model_version = model_name, model_version
        self.requested_output_names = list(requested_output_names or [])

    def exec(self) -> InferenceResponse:
        # python_backend r24.10: a BLS call's failure is the response's error, not an exception.
        return BLS_MODELS[self.model_name](self)

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def trace(self) -> InferenceTrace:
        return self._trace

    def is_cancelled(self) -> bool:
        # python_backend r24.10 src/infer_request.cc InferRequest::IsCancelled: asks the server
        # (pb_cancel_) each call; here the flag the test set.
        return self._cancelled


class InferenceResponse:
    """A response: output tensors, or an error."""

    def __init__(
        self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None
    ):
        # python_backend r24.10 src/pb_stub.cc: InferenceResponse(output_tensors=[],
        # error=None); src/infer_response.cc InferResponse::Send turns an error into
        # TRITONSERVER_ErrorNew(Error()->Code(), Error()->Message()), so its code is the code
        # the client sees (INVALID_ARG → HTTP 400, INTERNAL → HTTP 500).
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    # python_backend r24.10 src/resources/triton_python_backend_utils.py: the first of
    # request.inputs() with that name, None if there is none.
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    # python_backend r24.10 src/resources/triton_python_backend_utils.py: likewise over
    # response.output_tensors().
    return next((t for t in response.output_tensors() if t.name() == name), None)


class MetricFamily:
    """A custom metric family; its series record what they were given (``value``)."""

    # python_backend r24.10 src/pb_stub.cc: MetricFamily(name, description, kind) with kinds
    # COUNTER, GAUGE, HISTOGRAM; Metric(labels=None, buckets=None); increment, set, observe.
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, name: str, description: str, kind: str):
        self.name, self.description, self.kind = name, description, kind
        self.series: list[Metric] = []

    def Metric(self, labels: dict | None = None, buckets: list | None = None) -> Metric:  # noqa: N802 - real API
        metric = Metric(labels or {}, buckets)
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
