"""A model run at fixed batch sizes: inputs padded to buckets, each warmed (or captured) at start.

``BucketedRunner`` keeps one static input buffer per bucket. A batch is cut into bucket-sized
pieces (``pipelines.buckets.pieces``); each piece is copied into its bucket's buffer and the
model runs on the whole buffer. Every bucket runs once at construction, so no request pays for
a shape the model has not seen. On a CUDA device it can also capture each bucket as a CUDA
graph and replay it: one launch for the whole network instead of one per kernel (the eager
forward of EfficientNet-Lite0 is launch-bound up to about 64 images, docs/gpu.md).

Rows past a piece's end hold whatever an earlier batch left there: the model must treat rows
independently (inference mode, no batch statistics), which every model served here does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pipelines.buckets import pieces


class BucketedRunner:
    """``fn`` over batches of any size, run only at the sizes in ``buckets``.

    Args:
        fn: batch tensor [b, ...] → output tensor [b, ...]; pure, rows independent.
        row: one input row (its shape, dtype and device; its values are not used).
        buckets: the batch sizes to run at, increasing.
        cuda_graphs: capture each bucket as a CUDA graph (on a CUDA device only; elsewhere
            the buckets run eagerly).
        memory_format: layout of the static input buffers (channels-last for convolutions).
    """

    def __init__(
        self,
        fn: Callable[[torch.Tensor], torch.Tensor],
        row: torch.Tensor,
        buckets: Sequence[int],
        cuda_graphs: bool = False,
        memory_format: torch.memory_format = torch.contiguous_format,
    ):
        self.fn = fn
        self.buckets = tuple(buckets)
        self.device = row.device
        self.graphed = cuda_graphs and row.device.type == "cuda"
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.runs = dict.fromkeys(self.buckets, 0)  # per bucket, for statistics and tests
        pool = torch.cuda.graph_pool_handle() if self.graphed else None
        # Largest first: the smaller graphs then fit in the memory the first one reserved.
        for size in sorted(self.buckets, reverse=True):
            buffer = torch.zeros((size, *row.shape), dtype=row.dtype, device=row.device)
            buffer = buffer.contiguous(memory_format=memory_format)
            self.inputs[size] = buffer
            with torch.inference_mode():
                if self.graphed:
                    self.outputs[size], self.graphs[size] = _capture(fn, buffer, pool)
                else:
                    fn(buffer)  # the warm-up: plans, kernels and memory for this shape
        if row.device.type == "cuda":
            torch.cuda.synchronize(row.device)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        """``fn(batch)``, computed at bucket sizes; rows in the order of ``batch``."""
        parts = []
        with torch.inference_mode():
            for start, end, size in pieces(len(batch), self.buckets):
                buffer = self.inputs[size]
                buffer[: end - start].copy_(batch[start:end], non_blocking=True)
                self.runs[size] += 1
                if self.graphed:
                    self.graphs[size].replay()
                    # The graph's output buffer is overwritten by its next replay.
                    parts.append(self.outputs[size][: end - start].clone())
                else:
                    parts.append(self.fn(buffer)[: end - start])
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _capture(fn, buffer: torch.Tensor, pool) -> tuple[torch.Tensor, torch.cuda.CUDAGraph]:
    """Warm ``fn`` up on a side stream, then capture it (PyTorch's documented recipe)."""
    side = torch.cuda.Stream(buffer.device)
    side.wait_stream(torch.cuda.current_stream(buffer.device))
    with torch.cuda.stream(side):
        for _ in range(3):  # cuDNN/cuBLAS choose and load their kernels outside the capture
            fn(buffer)
    torch.cuda.current_stream(buffer.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = fn(buffer)
    return output, graph
