"""Torch on a Python-backend instance: its device, and tensors in and out through DLPack.

For the models that run torch on their instance's device (``torch_model``, and preprocess on a
KIND_GPU instance): the batching glue (``batching``) is the same for every model, this part only
for those. torch is imported inside the functions, because CPU instances of the same models
import this module without needing torch.
"""

from __future__ import annotations

import triton_python_backend_utils as pb_utils


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
