"""Triton adapter: the classifier on onnxruntime or PyTorch (pipelines.backend.runtime).

The NGC container serves model.onnx / model.plan with its native backends instead.
"""

from pipelines.backend.runtime import RuntimeModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
