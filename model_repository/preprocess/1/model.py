"""Triton adapter: encoded images → uint8 pixels (pipelines.image does the work)."""

from pipelines.backend.image_model import PreprocessModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
