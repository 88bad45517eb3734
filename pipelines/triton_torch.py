"""A Python-backend classifier that runs EfficientNet-Lite0 in PyTorch on its instance's device.

For GPU machines whose tritonserver has neither the TensorRT nor the onnxruntime-gpu backend
(the bundled PyPI server; ``configs/gpu-local.pbtxt``). Inputs arrive through DLPack, on the
GPU when the previous step produced them there; every request of an execute call is
concatenated, run once and split back.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipelines import classification as spec
from pipelines import efficientnet_lite
from pipelines import triton_backend as tb


class TorchClassifier:
    """EfficientNet-Lite0, FP16 and channels-last on a GPU (fp32 on a CPU instance)."""

    def initialize(self, args):
        """Load the pinned weights (sha256-checked) onto this instance's device and warm up."""
        params = tb.parameters(args)
        self.device = tb.instance_device(args)
        self.dtype = torch.float16 if self.device != "cpu" else torch.float32
        weights = Path(params["weights"]) if params.get("weights") else None
        model = efficientnet_lite.load_pretrained(weights).to(self.device, self.dtype)
        self.model = model.to(memory_format=torch.channels_last)
        self._run(torch.zeros(1, spec.CHANNELS, spec.IMAGE_SIZE, spec.IMAGE_SIZE))

    def _run(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            batch = pixels.to(self.device, self.dtype).contiguous(memory_format=torch.channels_last)
            return self.model(batch).float()

    def execute(self, requests):
        """One response per request, in order; one forward pass for all of them."""
        pixels = [tb.input_tensor(r, spec.PIXELS, self.device) for r in requests]
        try:
            logits = self._run(torch.cat(pixels))
            parts = tb.split_rows(logits, [len(p) for p in pixels])
            return [tb.respond_tensors({spec.LOGITS: part}) for part in parts]
        except Exception:  # noqa: BLE001 - isolate the failing request below
            return [self._alone(p) for p in pixels]

    def _alone(self, pixels: torch.Tensor):
        try:
            return tb.respond_tensors({spec.LOGITS: self._run(pixels)})
        except Exception as exc:  # noqa: BLE001
            return tb.error(f"model failed: {exc}")
