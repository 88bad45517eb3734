"""Triton adapter: logits → top-k ImageNet labels and probabilities."""

from pipelines.backend.image_model import PostprocessModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
