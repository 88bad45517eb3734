"""The classifier's Python-backend model: onnxruntime or PyTorch, as the config says.

The ``runtime`` parameter picks: configs/local.pbtxt onnxruntime on CPU, configs/gpu-local.pbtxt
torch on GPU.
"""

from __future__ import annotations

from pipelines.backend import batching


class RuntimeModel:
    """Delegates to the runner the model config names; imports only that runner's library."""

    def initialize(self, args):
        """Pick and initialize the runner."""
        runtime = batching.parameters(args).get("runtime", "onnxruntime")
        if runtime == "onnxruntime":
            from pipelines.backend.onnx_model import OnnxRuntimeModel as Runner
        elif runtime == "torch":
            from pipelines.backend.torch_model import TorchClassifier as Runner
        else:
            raise ValueError(f"unknown runtime parameter {runtime!r}: onnxruntime or torch")
        self.runner = Runner()
        self.runner.initialize(args)

    def execute(self, requests):
        """The runner's responses, one per request."""
        return self.runner.execute(requests)
