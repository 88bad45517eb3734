"""Triton adapter: token embeddings + attention mask → L2-normalized sentence embedding."""

import numpy as np

from pipelines import embedding as spec
from pipelines import triton_backend as tb


class TritonPythonModel:
    """Pools all requests of equal sequence length in one vectorized call."""

    def execute(self, requests):
        """One response per request, in order."""
        hidden = [tb.input_array(r, spec.TOKEN_EMBEDDINGS) for r in requests]
        masks = [tb.input_array(r, spec.ATTENTION_MASK) for r in requests]
        responses = [None] * len(requests)
        for members in tb.group_by_shape(list(zip(hidden, masks, strict=True))):
            pooled = spec.mean_pool(
                np.concatenate([hidden[i] for i in members]),
                np.concatenate([masks[i] for i in members]),
            )
            for i, part in zip(
                members, tb.split_rows(pooled, [len(masks[i]) for i in members]), strict=True
            ):
                responses[i] = tb.respond({spec.EMBEDDING: part})
        return responses
