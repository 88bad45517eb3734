"""Triton adapter: image bytes → top-k labels, the whole classify pipeline in one step."""

from pipelines.backend.image_model import FusedClassifyModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
