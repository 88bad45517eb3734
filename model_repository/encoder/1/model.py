"""Triton adapter: the encoder's model.onnx on onnxruntime (only with configs/local.pbtxt)."""

from pipelines.backend.onnx_model import OnnxRuntimeModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
