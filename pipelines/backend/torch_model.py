"""EfficientNet-Lite0 in PyTorch on a Python-backend instance's device.

The classifier step of the ``classify`` ensemble, and the model inside the one-step
``classify_fused``, on a GPU.

For GPU machines whose tritonserver has neither the TensorRT nor the onnxruntime-gpu backend
(the bundled PyPI server; ``configs/gpu-local.pbtxt``). Inputs arrive through DLPack, on the
GPU when the previous step produced them there; every request of an execute call is
concatenated, run once and split back.

What the config's parameters switch (all off by default; docs/gpu.md has what each changed):

* ``buckets`` ("8,16,32,64,128"): on a GPU, pad every batch to the next of these sizes and run
  each size once at start, so no request pays for a shape the model has not seen;
* ``cuda_graphs`` (yes): with buckets, capture each bucket as a CUDA graph and replay it;
* ``fold_batchnorm`` (yes): fold BatchNorm into the convolutions before the cast to FP16;
* ``output_device`` (cpu): hand the logits over in host memory instead of on the GPU.
"""

from __future__ import annotations

import torch

from pipelines import classification
from pipelines.backend import batching, torch_io
from pipelines.gpu_classifier import ImageClassifier


class TorchClassifier:
    """The classifier step: uint8 PIXELS in, LOGITS out, one forward pass per execute."""

    def initialize(self, args):
        """Load the pinned weights (sha256-checked) onto this instance's device and warm up."""
        self.name = args["model_name"]
        params = batching.parameters(args)
        self.device = torch_io.instance_device(args)
        max_batch = batching.max_batch_size(args)
        self.classifier = ImageClassifier.from_parameters(params, self.device, max_batch)
        to_host = params.get("output_device") == "cpu"
        self.run = batching.concatenated(
            lambda b: {classification.LOGITS: self._logits(b[classification.PIXELS], to_host)},
            torch.cat,
        )

    def _logits(self, pixels: torch.Tensor, to_host: bool) -> torch.Tensor:
        logits = self.classifier.logits(pixels).float()
        return logits.cpu() if to_host else logits

    def execute(self, requests):
        """One response per request, in order; one forward pass for all of them.

        A pass that fails is repeated per request, so only the culprit fails.
        """
        return batching.execute(
            requests,
            lambda r: batching.inputs(r, [classification.PIXELS], self._read),
            self.run,
            model=self.name,
            isolate=True,
            respond=torch_io.respond_tensors,
        )

    def _read(self, request, name):
        return torch_io.input_tensor(request, name, self.device)
