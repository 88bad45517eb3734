"""A Python-backend model that runs an ONNX file on onnxruntime, for servers without its backend.

Inside the NGC container the native onnxruntime backend serves the same ``model.onnx`` from the
same folder (``config.pbtxt``); locally ``configs/local.pbtxt`` selects this runner instead. Input
and output names come from the model config, so every ONNX model of the repository shares it:
its ``1/model.py`` is one import line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipelines.backend import batching, engines


class OnnxRuntimeModel:
    """Concatenate every request of an execute call, run once, split back in order.

    Subclasses may check or convert inputs in ``read`` (``read(request, name)`` → array); the
    config parameter ``onnxruntime_extensions: "yes"`` registers onnxruntime-extensions' ops.
    """

    read = staticmethod(batching.input_array)

    def initialize(self, args):
        """Open the graph with the thread budget the config gives this instance."""
        self.name = args["model_name"]
        config = json.loads(args["model_config"])
        params = batching.parameters(args)
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.engine = engines.open_engine(path, self.outputs, params)
        self.run = batching.concatenated(self._run)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.engine(feeds), strict=True))

    def execute(self, requests):
        """One response per request, in order; requests of equal shapes share one run.

        A run that fails is repeated per request, so only the culprit fails.
        """
        return batching.execute(
            requests,
            lambda r: batching.inputs(r, self.inputs, self.read),
            self.run,
            model=self.name,
            group=batching.shapes,
            isolate=True,
        )
