"""Triton adapter: the classifier on onnxruntime or PyTorch (pipelines.triton_runtime).

The NGC container serves model.onnx / model.plan with its native backends instead.
"""

from pipelines.triton_runtime import RuntimeModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
