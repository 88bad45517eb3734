"""A Python-backend classifier that runs EfficientNet-Lite0 in PyTorch on its instance's device.

For GPU machines whose tritonserver has neither the TensorRT nor the onnxruntime-gpu backend
(the bundled PyPI server; ``configs/gpu-local.pbtxt``). Inputs arrive through DLPack, on the
GPU when the previous step produced them there; every request of an execute call is
concatenated, run once and split back.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipelines import classification, efficientnet_lite
from pipelines.backend import batching as bk
from pipelines.backend import torch_io


class TorchClassifier:
    """EfficientNet-Lite0, FP16 and channels-last on a GPU (fp32 on a CPU instance)."""

    def initialize(self, args):
        """Load the pinned weights (sha256-checked) onto this instance's device and warm up."""
        self.name = args["model_name"]
        params = bk.parameters(args)
        self.device = torch_io.instance_device(args)
        self.dtype = torch.float16 if self.device != "cpu" else torch.float32
        weights = Path(params["weights"]) if params.get("weights") else None
        model = efficientnet_lite.load_pretrained(weights).to(self.device, self.dtype)
        self.model = model.to(memory_format=torch.channels_last)
        self._run(
            torch.zeros(
                1,
                classification.CHANNELS,
                classification.IMAGE_SIZE,
                classification.IMAGE_SIZE,
                dtype=torch.uint8,
            )
        )
        self.run = bk.concatenated(
            lambda b: {classification.LOGITS: self._run(b[classification.PIXELS])}, torch.cat
        )

    def _run(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            # uint8 pixels: the network normalizes them in its own precision.
            batch = pixels.to(self.device).contiguous(memory_format=torch.channels_last)
            return self.model(batch).float()

    def execute(self, requests):
        """One response per request, in order; one forward pass for all of them.

        A pass that fails is repeated per request, so only the culprit fails.
        """
        return bk.execute(
            requests,
            lambda r: bk.inputs(r, [classification.PIXELS], self._read),
            self.run,
            model=self.name,
            isolate=True,
            respond=torch_io.respond_tensors,
        )

    def _read(self, request, name):
        return torch_io.input_tensor(request, name, self.device)
