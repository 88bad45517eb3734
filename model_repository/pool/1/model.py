"""Triton adapter: token embeddings + attention mask → L2-normalized sentence embedding."""

import numpy as np

from pipelines import embedding as spec
from pipelines import triton_backend as tb


class TritonPythonModel:
    """Pools all requests of equal sequence length in one vectorized call.

    On a KIND_GPU instance the token embeddings are read where the encoder left them (DLPack)
    and pooled there; only the pooled vectors leave the GPU.
    """

    def initialize(self, args):
        """Note this instance's device."""
        self.device = tb.instance_device(args)

    def execute(self, requests):
        """One response per request, in order."""
        if self.device == "cpu":
            get, cat, pool, respond = tb.input_array, np.concatenate, spec.mean_pool, tb.respond
        else:
            import torch

            def get(request, name):
                return tb.input_tensor(request, name, self.device)

            cat, pool, respond = torch.cat, spec.mean_pool_torch, tb.respond_tensors
        hidden = [get(r, spec.TOKEN_EMBEDDINGS) for r in requests]
        masks = [get(r, spec.ATTENTION_MASK) for r in requests]
        responses = [None] * len(requests)
        for members in tb.group_by_shape(list(zip(hidden, masks, strict=True))):
            pooled = pool(cat([hidden[i] for i in members]), cat([masks[i] for i in members]))
            sizes = [len(masks[i]) for i in members]
            for i, part in zip(members, tb.split_rows(pooled, sizes), strict=True):
                responses[i] = respond({spec.EMBEDDING: part})
        return responses
