"""Batch buckets: a few fixed batch sizes that every batch is padded up to (or cut into).

Triton's dynamic batcher forms every batch size from 1 to ``max_batch_size``. On a GPU each new
size costs setup inside the request that first brings it (per-shape cuDNN plans, kernels loaded
on first use, allocator growth), and a CUDA graph exists only for the shapes it was captured at.
Padding each batch to the next of a few sizes bounds the shapes a model ever sees, so all of
them can be warmed (and captured) before the first request; docs/gpu.md says what that changed.

Plain Python: the GPU runner (``pipelines.graphs``) and its tests use it without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

# Powers of two from 8: a batch of n pads to at most 2n - 1 rows (and 1-7 rows to 8, where a
# GPU's time per batch hardly depends on the rows).
DEFAULT = (8, 16, 32, 64, 128, 256)


def parse(text: str, max_batch_size: int | None = None) -> tuple[int, ...]:
    """Buckets from a config parameter such as ``"8,16,32,64,128"``.

    Args:
        text: comma-separated positive sizes, strictly increasing.
        max_batch_size: if given, the largest bucket must reach it, or batches the batcher
            forms would have to be cut where one run could have taken them.

    Raises:
        ValueError: a size that is not a positive integer, sizes out of order, or a largest
            bucket below ``max_batch_size``.
    """
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"buckets {text!r}: comma-separated batch sizes, e.g. 8,16,32") from None
    if any(s < 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
        raise ValueError(f"buckets {text!r}: positive sizes, strictly increasing")
    if max_batch_size is not None and sizes[-1] < max_batch_size:
        raise ValueError(
            f"buckets {text!r}: the largest ({sizes[-1]}) is below max_batch_size "
            f"({max_batch_size}), so full batches would be cut in two"
        )
    return sizes


def bucket_for(rows: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``rows`` (1 <= rows <= the largest bucket)."""
    for size in buckets:
        if size >= rows:
            return size
    raise ValueError(f"{rows} rows exceed the largest bucket ({buckets[-1]})")


def pieces(rows: int, buckets: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, end, bucket)`` runs that cover ``rows`` rows in order.

    Full runs of the largest bucket first, then the rest in the smallest bucket that holds it:
    300 rows with buckets up to 256 are one run of 256 and one of 44 padded to 64.
    """
    largest, out, start = buckets[-1], [], 0
    while rows - start > largest:
        out.append((start, start + largest, largest))
        start += largest
    if rows > start:
        out.append((start, rows, bucket_for(rows - start, buckets)))
    return out


def padded_rows(rows: int, buckets: Sequence[int]) -> int:
    """How many rows the runs of ``pieces`` compute, padding included."""
    return sum(bucket for _, _, bucket in pieces(rows, buckets))
