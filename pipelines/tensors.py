"""What a model takes and gives: each tensor's name, type and dims, as config.pbtxt says them.

Each service writes its models' signatures once, with these types (``pipelines.classification``,
``pipelines.embedding``); ``model_config`` holds every config and every variant of it to them, so
a config that drifts from the code that reads it fails ``python -m model_config --check``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Tensor:
    """One input or output.

    Attributes:
        name: the tensor's name in requests, responses and config.pbtxt.
        datatype: the KServe v2 datatype clients send (``BYTES``, ``FP32``, ``INT64``...);
            config.pbtxt writes it ``TYPE_<datatype>``, with ``TYPE_STRING`` for ``BYTES``.
        dims: per batch item where the model batches (Triton adds the batch dimension); the
            whole shape where it does not. -1 is any size.
        optional: an input a request may leave out.
    """

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False

    @property
    def config_type(self) -> str:
        """The ``data_type`` config.pbtxt writes for it."""
        return "TYPE_STRING" if self.datatype == "BYTES" else f"TYPE_{self.datatype}"

    def rows(self) -> Tensor:
        """The same tensor with a leading dimension of its own.

        For a model that does not batch (max_batch_size 0) and takes or gives a list of these.
        """
        return replace(self, dims=(-1, *self.dims))

    def as_optional(self) -> Tensor:
        """The same tensor as an input a request may leave out."""
        return replace(self, optional=True)


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    def input(self, name: str) -> Tensor:
        """The input called ``name``; KeyError if there is none."""
        return _named(self.inputs, name)

    def output(self, name: str) -> Tensor:
        """The output called ``name``; KeyError if there is none."""
        return _named(self.outputs, name)


def _named(tensors: tuple[Tensor, ...], name: str) -> Tensor:
    for tensor in tensors:
        if tensor.name == name:
            return tensor
    raise KeyError(name)
