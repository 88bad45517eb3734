"""Triton adapter: embed_graph's model.onnx (tokenizer op + encoder) on onnxruntime, locally."""

import numpy as np

from pipelines import tokenization
from pipelines.backend import batching
from pipelines.backend.onnx_model import OnnxRuntimeModel


class TritonPythonModel(OnnxRuntimeModel):
    """The one graph, after the checks the tokenize step makes (UTF-8, not empty, size)."""

    @staticmethod
    def read(request, name):
        """TEXT items as str, or ``RequestError`` naming the bad one."""
        try:
            texts = tokenization.decode_texts(batching.input_array(request, name))
        except tokenization.TextError as exc:
            raise batching.RequestError(str(exc)) from None
        return np.array(texts, dtype=object).reshape(-1, 1)
