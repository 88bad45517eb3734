"""A TensorRT engine run from a Python step, on torch tensors that stay on the GPU.

For a GPU host whose tritonserver has no TensorRT backend (the PyPI build) but whose Python has
TensorRT: ``classify_fused`` runs the classifier's engine (built from the exported ONNX by
``python -m export.tensorrt``) where it would otherwise run PyTorch, with nvJPEG decode and the
top-k around it unchanged. TensorRT 10's API: one execution context per optimization profile,
each bound once to its profile, so a batch picks its context instead of switching profiles
inside a request; tensors are bound by address and run on the current torch stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

# TensorRT's data types, by the name of their torch twins (trt.DataType members).
_TORCH_TYPES = {
    "FLOAT": torch.float32,
    "HALF": torch.float16,
    "INT8": torch.int8,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "BF16": torch.bfloat16,
}


def profile_for(rows: int, ranges: Sequence[tuple[int, int]]) -> int:
    """The first profile whose batch range (min, max) holds ``rows``.

    Raises:
        ValueError: no profile takes that many rows.
    """
    for index, (low, high) in enumerate(ranges):
        if low <= rows <= high:
            return index
    raise ValueError(f"no optimization profile takes a batch of {rows}: {list(ranges)}")


class EngineRunner:
    """One engine with one input and one output, batch axis first.

    Args:
        plan: the serialized engine.
        device: ``cuda:N``.
        input_name: its input tensor (every profile's batch range is read for it).
        output_name: its output tensor.
    """

    def __init__(self, plan: Path, device: str, input_name: str, output_name: str):
        import tensorrt as trt

        self.device, self.input_name, self.output_name = device, input_name, output_name
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = runtime.deserialize_cuda_engine(Path(plan).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{plan} is not an engine for this GPU and TensorRT version")
        self.output_dtype = _TORCH_TYPES[self.engine.get_tensor_dtype(output_name).name]
        self.ranges, self.contexts = [], []
        stream = torch.cuda.current_stream(device).cuda_stream
        for index in range(self.engine.num_optimization_profiles):
            low, _, high = self.engine.get_tensor_profile_shape(input_name, index)
            self.ranges.append((low[0], high[0]))
            context = self.engine.create_execution_context()
            context.set_optimization_profile_async(index, stream)
            self.contexts.append(context)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        """The engine's output for ``batch`` (on this device), as a new tensor."""
        context = self.contexts[profile_for(len(batch), self.ranges)]
        batch = batch.contiguous()
        context.set_input_shape(self.input_name, tuple(batch.shape))
        output = torch.empty(
            tuple(context.get_tensor_shape(self.output_name)),
            dtype=self.output_dtype,
            device=self.device,
        )
        context.set_tensor_address(self.input_name, batch.data_ptr())
        context.set_tensor_address(self.output_name, output.data_ptr())
        if not context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        return output
