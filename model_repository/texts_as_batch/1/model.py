"""Triton adapter: a 1-D batch of texts → embed's [N, 1] rows (pipelines.embedding)."""

from pipelines.backend.text_model import TextRowsModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
