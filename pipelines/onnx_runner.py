"""onnxruntime sessions with an explicit thread budget, for served models and references."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort


def create_session(
    path: Path | str | bytes,
    intra_op_threads: int = 1,
    inter_op_threads: int = 1,
    custom_ops: bool = False,
) -> ort.InferenceSession:
    """A CPU session whose thread pools are sized explicitly.

    onnxruntime defaults to one thread per core in every session; with several Triton instances
    (each its own process) on one machine that oversubscribes the cores, so every caller says
    how many threads it may use. That budget is capped at the cores this process may run on
    (:func:`usable_cores`): two threads on one pinned core only take turns, and lose time doing
    it. ``custom_ops`` registers onnxruntime-extensions' operators (the in-graph tokenizer);
    ``path`` may also be a serialized model.
    """
    intra_op_threads = min(intra_op_threads, usable_cores())
    options = ort.SessionOptions()
    if custom_ops:
        options.register_custom_ops_library(str(custom_ops_library()))
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning threads burn the cores that the other pipeline steps need between batches.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def custom_ops_library() -> Path:
    """onnxruntime-extensions' operator library, found without importing its package.

    ``onnxruntime_extensions.get_library_path()`` imports the package, whose ``__init__``
    imports torch where torch is installed: 1.5 s and about 300 MB more for each process
    that only needs the library's path (every embed_graph stub).

    Raises:
        FileNotFoundError: onnxruntime-extensions is not installed.
    """
    spec = importlib.util.find_spec("onnxruntime_extensions")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            library = Path(folder) / f"_extensions_pydll{suffix}"
            if library.is_file():
                return library
    raise FileNotFoundError(
        "onnxruntime-extensions' operator library: pip install onnxruntime-extensions"
    )


def usable_cores() -> int:
    """How many cores this process may run on (its CPU affinity, e.g. under ``taskset``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API on this platform
        return max(1, os.cpu_count() or 1)


def run(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]
) -> list[np.ndarray]:
    """Run the session on contiguous inputs and return the named outputs in order."""
    return session.run(list(outputs), {k: np.ascontiguousarray(v) for k, v in feeds.items()})
