"""The torch side of the Python-backend glue (pipelines/backend/torch_io.py) against the
stand-in pb_utils."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton_python_backend_utils as pb_utils

from pipelines.backend import torch_io

KDL_CUDA = 2  # dlpack.h DLDeviceType


class OnGpu:
    """A DLPack producer whose ``__dlpack_device__`` says GPU 0, over CPU memory (no GPU here).

    The stand-in pb_utils then holds it as the stub holds a GPU input: ``is_cpu()`` is False and
    ``as_numpy()`` refuses, so only the DLPack path can read it.
    """

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__()

    def __dlpack_device__(self):
        return (KDL_CUDA, 0)


def test_torch_outputs_are_handed_over_as_tensors_not_capsules():
    # The stub waits for the producer's stream only for an object with __dlpack__; a capsule
    # made by to_dlpack skips that (python_backend r24.10 src/pb_tensor.cc FromDLPack).
    response = torch_io.respond_tensors({"LOGITS": torch.arange(6.0).reshape(2, 3)})
    (tensor,) = response.output_tensors()
    assert isinstance(tensor.dlpack_source, torch.Tensor)
    assert tensor.as_numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_gpu_instance_makes_its_gpu_current_and_keeps_cudnn_benchmark_off(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    device = torch_io.instance_device(
        {"model_instance_kind": "GPU", "model_instance_device_id": "1"}
    )
    assert device == "cuda:1" and chosen == [1]
    assert torch.backends.cudnn.benchmark is False


def test_a_cpu_instance_touches_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: (_ for _ in ()).throw(AssertionError))
    assert (
        torch_io.instance_device({"model_instance_kind": "CPU", "model_instance_device_id": "0"})
        == "cpu"
    )


def test_an_input_held_on_the_gpu_is_read_through_dlpack_without_a_copy():
    data = torch.arange(6.0).reshape(2, 3)
    held = pb_utils.Tensor.from_dlpack("PIXELS", OnGpu(data))
    assert not held.is_cpu()
    with pytest.raises(pb_utils.TritonModelException, match="stored in GPU"):
        held.as_numpy()
    got = torch_io.input_tensor(pb_utils.InferenceRequest([held]), "PIXELS", "cpu")
    assert got.data_ptr() == data.data_ptr()  # DLPack hands over the same memory
    assert torch.equal(got, data)


def test_an_input_in_cpu_memory_is_read_as_numpy_and_a_missing_one_is_none():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    request = pb_utils.InferenceRequest([pb_utils.Tensor("PIXELS", array)])
    got = torch_io.input_tensor(request, "PIXELS", "cpu")
    assert (
        got.data_ptr()
        == pb_utils.get_input_tensor_by_name(request, "PIXELS").as_numpy().ctypes.data
    )
    assert got.tolist() == array.tolist()
    assert torch_io.input_tensor(request, "MISSING", "cpu") is None
