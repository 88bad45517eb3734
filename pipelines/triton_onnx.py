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

from pipelines import onnx_runner
from pipelines import triton_backend as tb


class OnnxRuntimeModel:
    """Concatenate every request of an execute call, run once, split back in order."""

    def initialize(self, args):
        """Open the session with the thread budget the config gives this instance."""
        config = json.loads(args["model_config"])
        params = tb.parameters(args)
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = onnx_runner.create_session(
            path,
            intra_op_threads=int(params.get("intra_op_thread_count", "1")),
            inter_op_threads=int(params.get("inter_op_thread_count", "1")),
        )

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return onnx_runner.run(self.session, feeds, self.outputs)

    def execute(self, requests):
        """One response per request, in order; requests of equal shapes share one run."""
        arrays = [{name: tb.input_array(r, name) for name in self.inputs} for r in requests]
        responses: list = [None] * len(requests)
        for members in tb.group_by_shape([[f[n] for n in self.inputs] for f in arrays]):
            try:
                feeds = {
                    n: np.concatenate([arrays[i][n] for i in members])
                    if len(members) > 1
                    else arrays[members[0]][n]
                    for n in self.inputs
                }
                outputs = self._run(feeds)
                sizes = [len(arrays[i][self.inputs[0]]) for i in members]
                parts = [tb.split_rows(out, sizes) for out in outputs]
                for j, i in enumerate(members):
                    responses[i] = tb.respond(
                        {n: p[j] for n, p in zip(self.outputs, parts, strict=True)}
                    )
            except Exception:  # noqa: BLE001 - isolate the failing request below
                for i in members:
                    responses[i] = self._alone(arrays[i])
        return responses

    def _alone(self, feeds: dict[str, np.ndarray]):
        # The batched run failed: run this request alone so only the culprit fails.
        try:
            return tb.respond(dict(zip(self.outputs, self._run(feeds), strict=True)))
        except Exception as exc:  # noqa: BLE001
            return tb.error(f"model failed: {exc}")
