"""Triton adapter: the classifier's ONNX model on onnxruntime, for servers without its backend.

Inside the NGC container the native onnxruntime backend serves the same model.onnx instead
(config.pbtxt); this file is used only with ``--model-config-name=local``.
"""

from pathlib import Path

import numpy as np

from pipelines import classification as spec
from pipelines import onnx_runner
from pipelines import triton_backend as tb


class TritonPythonModel:
    """One onnxruntime run per execute over the concatenation of all requests."""

    def initialize(self, args):
        """Open the session with the thread budget the config gives this instance."""
        params = tb.parameters(args)
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = onnx_runner.create_session(
            path,
            intra_op_threads=int(params.get("intra_op_thread_count", "1")),
            inter_op_threads=int(params.get("inter_op_thread_count", "1")),
        )

    def _run(self, pixels):
        return onnx_runner.run(self.session, {spec.PIXELS: pixels}, [spec.LOGITS])[0]

    def execute(self, requests):
        """Concatenate, run once, split back in request order."""
        arrays = [tb.input_array(r, spec.PIXELS) for r in requests]
        try:
            batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            parts = tb.split_rows(self._run(batch), [len(a) for a in arrays])
            return [tb.respond({spec.LOGITS: p}) for p in parts]
        except Exception:  # noqa: BLE001 - isolate the failing request below
            pass
        # The batched run failed: run requests one by one so only the culprit fails.
        responses = []
        for pixels in arrays:
            try:
                responses.append(tb.respond({spec.LOGITS: self._run(pixels)}))
            except Exception as exc:  # noqa: BLE001
                responses.append(tb.error(f"classifier failed: {exc}"))
        return responses
