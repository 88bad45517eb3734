"""Triton adapter: texts → embeddings with the encoder graph of this version, in one step."""

from pipelines.backend.text_model import TokenizeEncodeModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
