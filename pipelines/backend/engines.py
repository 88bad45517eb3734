"""How a Python step runs a model's graph: the one place that chooses, from the config.

Three steps run a graph inside their own stub: the ONNX models on servers without the
onnxruntime backend (``onnx_model``), ``tokenize_encode``'s encoder and ``classify_fused``'s
classifier. Each asks ``open_engine`` for an ``Engine`` (feeds in, named outputs out) and never
looks at how it runs: in this process on onnxruntime, the model this server serves (a TensorRT
engine or the native onnxruntime backend on a GPU) called through BLS, or, for the text
encoder on a GPU host without either backend, the network in PyTorch on the step's own device
(``torch_encoder``). The engine also says which file answers and how (``source``,
``numerics``), which the per-text cache keys on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from pipelines import embedding, onnx_runner, padding

RUNTIMES = ("onnxruntime", "triton", "torch")


class Served(NamedTuple):
    """A model this server serves from the graph's folder, for the ``triton`` runtime."""

    model: str
    version: int
    max_rows: int  # the most rows one call takes: the served model's max_batch_size


class Engine(Protocol):
    """Runs one model's graph on a batch; rows of every output follow the rows of the feeds."""

    runtime: str  # one of RUNTIMES
    source: Path  # the file whose numbers come back: the graph, an engine built from it, weights

    @property
    def numerics(self) -> str:
        """What computes the numbers from ``source``: the runtime, and any precision it picks."""
        ...

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs the engine was opened for, in that order."""
        ...


@dataclass
class OnnxEngine:
    """The graph on onnxruntime in this process, with the thread budget the config gives."""

    source: Path
    outputs: Sequence[str]
    session: object
    runtime: str = "onnxruntime"

    @property
    def numerics(self) -> str:
        """The runtime: it runs the graph in the graph's own precision."""
        return self.runtime

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One run of the session on every row."""
        return onnx_runner.run(self.session, feeds, self.outputs)


@dataclass
class TritonEngine:
    """A model this server serves, called through BLS in pieces of at most ``max_rows`` rows."""

    source: Path
    outputs: Sequence[str]
    model: str
    version: int
    max_rows: int
    runtime: str = "triton"

    @property
    def numerics(self) -> str:
        """The runtime: the served model's file (``source``) fixes its precision."""
        return self.runtime

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The served model's outputs, on the host, in the rows' order."""
        import triton_python_backend_utils as pb_utils

        rows = len(next(iter(feeds.values())))
        pieces: list[list[np.ndarray]] = []
        for start in range(0, rows, self.max_rows):
            part = slice(start, start + self.max_rows)
            request = pb_utils.InferenceRequest(
                model_name=self.model,
                model_version=self.version,
                requested_output_names=list(self.outputs),
                inputs=[
                    pb_utils.Tensor(name, np.ascontiguousarray(array[part]))
                    for name, array in feeds.items()
                ],
            )
            response = request.exec()
            if response.has_error():
                raise RuntimeError(f"{self.model} {self.version}: {response.error().message()}")
            pieces.append([_on_host(response, name) for name in self.outputs])
        return [np.concatenate(column) for column in zip(*pieces, strict=True)]


def _on_host(response, name: str) -> np.ndarray:
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_output_tensor_by_name(response, name)
    if tensor.is_cpu():
        return tensor.as_numpy()
    # A GPU engine's output: to the host through DLPack (torch is there).
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(tensor.to_dlpack()).cpu().numpy()


def open_engine(
    graph: Path,
    outputs: Sequence[str],
    params: Mapping[str, str],
    runtime: str = "onnxruntime",
    served: Served | None = None,
    device: str = "cpu",
    max_rows: int = embedding.MAX_TEXTS,
) -> Engine:
    """The engine that runs ``graph`` (a model.onnx) as the config's parameters say.

    Args:
        graph: the ONNX file, in ``<model repository>/<model>/<version>/``.
        outputs: the outputs each call returns, in order.
        params: the config's parameters: ``intra_op_thread_count``, ``inter_op_thread_count``
            and ``onnxruntime_extensions``, for onnxruntime; for torch, ``weights`` (a compact
            copy of the text encoder's weights, absolute or relative to the model repository;
            absent: the pinned package), ``max_batch_tokens`` and
            ``intra_op_thread_count``.
        runtime: ``onnxruntime`` (in this process), ``triton`` (through BLS) or ``torch`` (the
            text encoder's network, whose graph ``graph`` is, in PyTorch on ``device``).
        served: for ``triton``, the model that this server serves from ``graph``'s folder.
        device: for ``torch``, the instance's device (``torch_io.instance_device``).
        max_rows: for ``torch``, the most rows one call holds (the step's max_batch_size).

    Raises:
        ValueError: an unknown runtime, ``triton`` without ``served``, or ``torch`` asked for
            other outputs than the text encoder's.
    """
    if runtime == "onnxruntime":
        session = onnx_runner.create_session(
            graph,
            intra_op_threads=int(params.get("intra_op_thread_count", "1")),
            inter_op_threads=int(params.get("inter_op_thread_count", "1")),
            custom_ops=params.get("onnxruntime_extensions") == "yes",
        )
        return OnnxEngine(graph, outputs, session)
    if runtime == "triton" and served is not None:
        # What the model serves from: a TensorRT plan where one was built, else the graph.
        plan = graph.with_name("model.plan")
        source = plan if plan.exists() else graph
        return TritonEngine(source, outputs, served.model, served.version, served.max_rows)
    if runtime == "torch" and list(outputs) == [embedding.EMBEDDING]:
        from pipelines.backend import torch_encoder  # torch: only this runtime imports it

        weights = params.get("weights")
        return torch_encoder.open_encoder(
            # Relative to the model repository, like the paths Triton's configs hold.
            graph.parents[2] / weights if weights else None,
            device,
            max_rows,
            int(params.get("max_batch_tokens", padding.MAX_BATCH_TOKENS)),
            int(params.get("intra_op_thread_count", "0")),
        )
    raise ValueError(
        f"runtime {runtime!r}: one of {', '.join(RUNTIMES)} "
        f"(triton needs a model; torch runs the text encoder only)"
    )
