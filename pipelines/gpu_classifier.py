"""EfficientNet-Lite0 on one torch device, and the whole image pipeline there: no Triton.

``ImageClassifier`` is the network as the GPU steps run it (FP16, channels-last; optionally
BatchNorm folded and batches padded to warmed buckets replaying CUDA graphs);
``TorchImagePipeline`` adds nvJPEG decode and top-k on the device, as ``classify_fused`` runs
it on a GPU. The Python-backend adapters (``pipelines.backend``) and the GPU check and
diagnosis use the same classes, so what is measured in-process is what is served.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from pipelines import buckets, classification, efficientnet_lite, gpu_image, imagenet
from pipelines.graphs import BucketedRunner


class ImageClassifier:
    """EfficientNet-Lite0 on one device: uint8 pixels → logits (FP16 on a GPU, fp32 on a CPU).

    Args:
        device: ``cuda:N`` or ``cpu``.
        weights: a state dict file to load instead of the pinned package (sha256-checked).
        sizes: buckets to pad batches to (None: run each batch at its own size).
        cuda_graphs: with ``sizes``, replay a CUDA graph per bucket (CUDA devices only).
        fold: fold BatchNorm into the convolutions first.
        engine: a TensorRT engine built from the classifier's ONNX model, run instead of
            PyTorch (``pipelines.tensorrt_runner``); the other switches do not apply to it.
    """

    def __init__(
        self,
        device: str,
        weights: Path | None = None,
        sizes: Sequence[int] | None = None,
        cuda_graphs: bool = False,
        fold: bool = False,
        engine: Path | None = None,
    ):
        self.device = device
        self.dtype = torch.float16 if device != "cpu" else torch.float32
        if engine is not None:
            self.run = _engine_runner(engine, device)
            return
        model = efficientnet_lite.load_pretrained(weights)
        if fold:
            model = efficientnet_lite.fold_batchnorm(model)
        model = model.to(device, self.dtype)
        self.model = model.to(memory_format=torch.channels_last)
        row = torch.zeros(
            (classification.CHANNELS, classification.IMAGE_SIZE, classification.IMAGE_SIZE),
            dtype=torch.uint8,
            device=device,
        )
        # Buckets bound the shapes a GPU sets up kernels and graphs for; a CPU instance (a
        # machine without a GPU serving the GPU configs, as the tests do) runs each batch at its
        # own size, where padding would only multiply the work.
        if sizes and device != "cpu":
            self.run = BucketedRunner(
                self._forward, row, sizes, cuda_graphs, memory_format=torch.channels_last
            )
        else:
            self.run = self._forward
            self._forward(row[None])  # batch 1 warmed; every other size meets its first request

    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # uint8 pixels: the network normalizes them in its own precision.
        return self.model(pixels.contiguous(memory_format=torch.channels_last))

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        """Logits [n, 1000] on this device, in the model's precision."""
        with torch.inference_mode():
            return self.run(pixels.to(self.device, non_blocking=True))

    @classmethod
    def from_parameters(cls, params: dict[str, str], device: str, max_batch_size: int):
        """The classifier the model config's parameters describe (the module docstring)."""
        sizes = params.get("buckets")
        return cls(
            device,
            weights=Path(params["weights"]) if params.get("weights") else None,
            sizes=buckets.parse(sizes, max_batch_size) if sizes else None,
            cuda_graphs=params.get("cuda_graphs") == "yes",
            fold=params.get("fold_batchnorm") == "yes",
            engine=Path(params["engine"]) if params.get("engine") else None,
        )


def _engine_runner(plan: Path, device: str):
    """The engine over batches of any size: cut into pieces its largest profile takes."""
    from pipelines.tensorrt_runner import EngineRunner

    runner = EngineRunner(plan, device, classification.PIXELS, classification.LOGITS)
    largest = (max(high for _, high in runner.ranges),)

    def run(batch: torch.Tensor) -> torch.Tensor:
        parts = [runner(batch[start:end]) for start, end, _ in buckets.pieces(len(batch), largest)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    return run


class TorchImagePipeline:
    """``classify_fused``'s work on a GPU: nvJPEG decode, resize, the model, top-k, in one process.

    Nothing crosses a process boundary on the GPU: JPEG bytes come in from host memory, and
    only each image's k ids and scores go back (docs/gpu.md says why this design).
    """

    def __init__(self, params: dict[str, str], device: str, max_batch_size: int):
        self.device = device
        self.classifier = ImageClassifier.from_parameters(params, device, max_batch_size)

    def preprocess(self, images: list[bytes]):
        """uint8 pixels [n, 3, 224, 224] on the device, and each image's error or None."""
        return gpu_image.preprocess_batch(images, self.device)

    def top_k(self, pixels: torch.Tensor, wanted: np.ndarray, k: int):
        """(class ids, scores) of the ``wanted`` rows of ``pixels``, k each, on the host."""
        rows = torch.from_numpy(wanted).to(pixels.device)
        return imagenet.top_k_tensor(self.classifier.logits(pixels[rows]), k)
