"""The text encoder in PyTorch on the step's own device: FP16 on a GPU, fp32 on a CPU.

For GPU hosts whose tritonserver has neither the onnxruntime nor the TensorRT backend (the PyPI
build, ``configs/gpu-local.pbtxt``): ``tokenize_encode`` runs MiniLM with its pooling
(``pipelines.bert.SentenceEncoder``) itself instead of a graph. ``pipelines.backend.engines``
opens it for the ``torch`` runtime; the step hands it the same length-sorted sub-batches as any
engine (``pipelines.padding.encode_sorted``).

Each sub-batch is padded up to a few shapes, its length to a bucket of ``padding.BUCKETS`` and
its rows to a power of two, and every shape the step can produce is run once at start: the
first run of a shape sets up cuBLAS and the kernels for it, which would otherwise happen inside
a request. Padded positions are masked, so a text's vector does not depend on its padding; a
padded row holds one unmasked pad token, so that no row of the attention is masked whole.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipelines import bert, embedding, minilm_weights, padding

log = logging.getLogger(__name__)


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """The row counts runs are padded to: powers of two below ``max_rows``, and ``max_rows``."""
    rows = [1 << i for i in range(max_rows.bit_length()) if 1 << i < max_rows]
    return (*rows, max_rows)


def padded_shape(rows: int, length: int, max_rows: int) -> tuple[int, int]:
    """The (rows, length) a run of ``rows`` texts of at most ``length`` tokens is padded to.

    More rows than ``max_rows`` (which the step never hands over) stay as they are.
    """
    bucket = next((b for b in row_buckets(max_rows) if b >= rows), rows)
    return bucket, padding.bucket_length(length)


def warm_shapes(max_rows: int, max_tokens: int) -> list[tuple[int, int]]:
    """Every padded shape of a run of at most ``max_rows`` texts and ``max_tokens`` positions.

    Runs are cut so (``padding.sub_batches``), except that a single longer text is a run too. A
    shape is reachable when the smallest run padded to it fits: one row more than the row
    bucket below, of one token more than the length bucket below.
    """
    return [
        (rows, length)
        for lower_length, length in itertools.pairwise((0, *padding.BUCKETS))
        for lower_rows, rows in itertools.pairwise((0, *row_buckets(max_rows)))
        if lower_rows == 0 or (lower_rows + 1) * (lower_length + 1) <= max_tokens
    ]


@dataclass
class TorchEngine:
    """MiniLM with mean pooling and L2 normalization, on one device, in one precision."""

    source: Path  # the weights the vectors come from: the package's zip or a compact copy
    model: bert.SentenceEncoder
    device: str
    dtype: torch.dtype
    max_rows: int
    runtime: str = "torch"

    @property
    def numerics(self) -> str:
        """How the vectors are computed, for the per-text cache's key: FP16 and fp32 differ."""
        return f"{self.runtime} {str(self.dtype).removeprefix('torch.')}"

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """[n, HIDDEN_SIZE] float32 unit vectors of the padded rows in ``feeds``, in order."""
        ids, mask = feeds[embedding.INPUT_IDS], feeds[embedding.ATTENTION_MASK]
        rows, length = ids.shape
        shape = padded_shape(rows, length, self.max_rows)
        if shape != ids.shape:
            padded_ids = np.full(shape, padding.PAD_ID, dtype=np.int64)
            padded_mask = np.zeros(shape, dtype=np.int64)
            padded_ids[:rows, :length], padded_mask[:rows, :length] = ids, mask
            padded_mask[rows:, 0] = 1
            ids, mask = padded_ids, padded_mask
        return [self._run(ids, mask)[:rows]]

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            vectors = self.model(
                torch.from_numpy(ids).to(self.device, non_blocking=True),
                torch.from_numpy(mask).to(self.device, non_blocking=True),
            )
            # One copy to the host, of the pooled vectors only.
            return vectors.float().cpu().numpy()

    def warm(self, max_tokens: int) -> int:
        """Run every shape a step with this ``max_tokens`` can hand over; returns how many."""
        shapes = warm_shapes(self.max_rows, max_tokens)
        for rows, length in shapes:
            self._run(np.zeros((rows, length), np.int64), np.ones((rows, length), np.int64))
        return len(shapes)


def open_encoder(
    weights: Path | None, device: str, max_rows: int, max_tokens: int, threads: int = 0
) -> TorchEngine:
    """The encoder on ``device``, warmed up for runs of the given sizes where it is a GPU.

    Args:
        weights: a compact copy of the weights (``pipelines.compact``); None reads the pinned
            package (sha256 checked).
        device: ``cuda:<id>`` or ``cpu`` (``torch_io.instance_device``).
        max_rows: the most texts one run holds (the step's max_batch_size).
        max_tokens: the most padded positions one run holds (``max_batch_tokens``).
        threads: torch's CPU threads in this process (0: torch's default, one per core).
    """
    if threads > 0:
        torch.set_num_threads(threads)
    on_gpu = device != "cpu"
    dtype = torch.float16 if on_gpu else torch.float32
    model = bert.SentenceEncoder(bert.load_pretrained(weights)).to(device, dtype).eval()
    source = weights if weights is not None else minilm_weights.model_zip()
    engine = TorchEngine(source, model, device, dtype, max_rows)
    if on_gpu:
        # FP16 products summed in FP32 all the way: cuBLAS may otherwise reduce split sums in
        # FP16, which costs accuracy for little speed at these sizes.
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        shapes = engine.warm(max_tokens)
        torch.cuda.synchronize(device)
        log.info("encoder on %s (%s): %d shapes warmed", device, dtype, shapes)
    return engine
