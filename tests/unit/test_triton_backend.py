"""The Python-backend glue (pipelines/backend/batching.py) against the stand-in pb_utils."""

from __future__ import annotations

import torch

from pipelines.backend import batching as tb


def test_torch_outputs_are_handed_over_as_tensors_not_capsules():
    # The stub waits for the producer's stream only for an object with __dlpack__; a capsule
    # made by to_dlpack skips that (python_backend r24.10 src/pb_tensor.cc FromDLPack).
    response = tb.respond_tensors({"LOGITS": torch.arange(6.0).reshape(2, 3)})
    (tensor,) = response.output_tensors()
    assert isinstance(tensor.dlpack_source, torch.Tensor)
    assert tensor.as_numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_gpu_instance_makes_its_gpu_current_and_keeps_cudnn_benchmark_off(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    device = tb.instance_device({"model_instance_kind": "GPU", "model_instance_device_id": "1"})
    assert device == "cuda:1" and chosen == [1]
    assert torch.backends.cudnn.benchmark is False


def test_a_cpu_instance_touches_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: (_ for _ in ()).throw(AssertionError))
    assert (
        tb.instance_device({"model_instance_kind": "CPU", "model_instance_device_id": "0"}) == "cpu"
    )
