"""Helpers for the Python-backend adapters in model_repository/*/1/model.py.

Imported only inside Triton's Python-backend stub, where ``triton_python_backend_utils`` exists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import triton_python_backend_utils as pb_utils


def parameters(args: dict) -> dict[str, str]:
    """The model config's ``parameters`` as plain strings (from ``initialize``'s args)."""
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def error(message: str, code: int | None = None) -> pb_utils.InferenceResponse:
    """A response that fails this request only, with a message naming the problem."""
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def cancelled() -> pb_utils.InferenceResponse:
    """The response for a request its client cancelled before we started on it."""
    return error("request cancelled", pb_utils.TritonError.CANCELLED)


def respond(outputs: dict[str, np.ndarray]) -> pb_utils.InferenceResponse:
    """A successful response holding the given named arrays."""
    tensors = [pb_utils.Tensor(k, np.ascontiguousarray(v)) for k, v in outputs.items()]
    return pb_utils.InferenceResponse(tensors)


def input_array(request: pb_utils.InferenceRequest, name: str) -> np.ndarray | None:
    """The named input as a numpy array (a view of Triton's buffer), or None if absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def group_by_shape(per_request: Sequence[Sequence[np.ndarray]]) -> list[list[int]]:
    """Indices of requests whose arrays agree in every non-batch dim, in request order.

    Only such requests can be concatenated into one batch (e.g. equal sequence lengths).
    """
    groups: dict[tuple, list[int]] = {}
    for i, arrays in enumerate(per_request):
        groups.setdefault(tuple(a.shape[1:] for a in arrays), []).append(i)
    return list(groups.values())


def split_rows(batch, sizes: Sequence[int]) -> list:
    """Cut a concatenated batch (numpy array or torch tensor) into per-request views."""
    if isinstance(batch, np.ndarray):
        return np.split(batch, np.cumsum(sizes)[:-1])
    return list(batch.split(list(sizes)))


# GPU instances ---------------------------------------------------------------------------------
def instance_device(args: dict) -> str:
    """The torch device of this model instance: ``cuda:<id>`` for KIND_GPU, else ``cpu``.

    Triton assigns the GPU per instance (instance_group ``gpus``); never assume ``cuda:0``. A
    GPU instance also makes its GPU the current CUDA device of the stub: the stub copies GPU
    outputs and synchronizes on the current device (python_backend r24.10 src/pb_memory.cc
    ``CopyBuffer``), which would otherwise be GPU 0 for an instance on GPU 1. cuDNN's
    benchmark mode stays off: the batcher forms every batch size from 1 to the max, and each
    new size would be autotuned inside a request.
    """
    if args.get("model_instance_kind") == "GPU":
        import torch

        index = int(args["model_instance_device_id"])
        torch.cuda.set_device(index)
        torch.backends.cudnn.benchmark = False
        return f"cuda:{index}"
    return "cpu"


def input_tensor(request: pb_utils.InferenceRequest, name: str, device: str):
    """The named input as a torch tensor on ``device``, or None if absent.

    Zero-copy through DLPack where Triton already holds it on the GPU (which needs the
    config parameter ``FORCE_CPU_ONLY_INPUT_TENSORS: no``).
    """
    import torch

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    if tensor.is_cpu():
        return torch.from_numpy(tensor.as_numpy()).to(device, non_blocking=True)
    return torch.from_dlpack(tensor.to_dlpack()).to(device)


def respond_tensors(outputs: dict) -> pb_utils.InferenceResponse:
    """A successful response from torch tensors, handed to Triton through DLPack.

    GPU tensors stay on their GPU: the next step reads them there, or Triton copies them once.
    The tensors themselves are handed over, not ``to_dlpack`` capsules: for an object with
    ``__dlpack__`` the stub passes its own stream and waits for the producer's work on it
    (python_backend r24.10 src/pb_tensor.cc ``FromDLPack``); a capsule skips that wait.
    """
    tensors = [pb_utils.Tensor.from_dlpack(k, v.contiguous()) for k, v in outputs.items()]
    return pb_utils.InferenceResponse(tensors)
