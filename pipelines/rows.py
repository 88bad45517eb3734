"""One output row per input row: the contract of every batched run, checked where it is split.

Without Triton, so that the Python-backend adapter (``pipelines.backend.batching``) and any
other batcher (the benchmark's FastAPI peer) hold a run to the same contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["RowCountError", "split_rows"]


class RowCountError(RuntimeError):
    """A run broke its contract: not one output row per input row, or one result per request.

    ``np.split`` would cut a short batch into short or empty pieces without a word; PyTriton's
    ``@batch`` and Ray Serve's batching refuse such a run the same way.
    """


def split_rows(batch, sizes: Sequence[int], name: str = "batch") -> list:
    """Cut a concatenated batch (numpy array or torch tensor) into per-request views.

    Raises:
        RowCountError: ``batch`` has not ``sum(sizes)`` rows (``name`` says which output).
    """
    if len(batch) != sum(sizes):
        raise RowCountError(f"output {name} has {len(batch)} rows for {sum(sizes)} input rows")
    if isinstance(batch, np.ndarray):
        return np.split(batch, np.cumsum(sizes)[:-1])
    return list(batch.split(list(sizes)))
