"""Triton adapter: token embeddings + attention mask → L2-normalized sentence embedding."""

import numpy as np

from pipelines import embedding as spec
from pipelines.backend import batching as bk

INPUTS = (spec.TOKEN_EMBEDDINGS, spec.ATTENTION_MASK)


class TritonPythonModel:
    """Pools all requests of equal sequence length in one vectorized call.

    On a KIND_GPU instance the token embeddings are read where the encoder left them (DLPack)
    and pooled there; only the pooled vectors leave the GPU.
    """

    def initialize(self, args):
        """Pick the numpy or the torch path for this instance's device."""
        self.device = bk.instance_device(args)
        if self.device == "cpu":
            self.read, concat, pool = bk.input_array, np.concatenate, spec.mean_pool
            self.respond = bk.respond_arrays
        else:
            import torch

            def read(request, name):
                return bk.input_tensor(request, name, self.device)

            self.read, concat, pool = read, torch.cat, spec.mean_pool_torch
            self.respond = bk.respond_tensors
        self.run = bk.concatenated(
            lambda b: {spec.EMBEDDING: pool(b[spec.TOKEN_EMBEDDINGS], b[spec.ATTENTION_MASK])},
            concat,
        )

    def execute(self, requests):
        """One response per request, in order."""
        return bk.execute(
            requests,
            lambda r: bk.inputs(r, INPUTS, self.read),
            self.run,
            group=bk.shapes,
            respond=self.respond,
        )
