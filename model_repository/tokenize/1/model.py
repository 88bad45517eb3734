"""Triton adapter: UTF-8 texts → word-piece ids and attention masks (pipelines.padding)."""

from pipelines.backend.text_model import TokenizeModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
