"""What each engine is built from: the recipes, and optimization profiles from a Triton config.

The profiles cover batch 1 up to ``max_batch_size``, one profile per batch range ending at a
preferred batch size (the sizes the dynamic batcher forms under load), each optimized (``opt``)
for that preferred size; the encoder's sequence axis spans the tokenizer's padding buckets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from pipelines import classification, embedding, padding, tokenization

DEFAULT_WORKSPACE_MIB = 4096
PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class Shapes:
    """min/opt/max shape of one input in one optimization profile (batch axis first)."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def as_trtexec(self, name: str) -> tuple[str, str, str]:
        """``NAME:AxBxC`` for each of min, opt, max."""
        return tuple(f"{name}:{'x'.join(map(str, s))}" for s in (self.min, self.opt, self.max))


Profile = dict[str, Shapes]  # input name → shapes


@dataclass(frozen=True)
class EngineSpec:
    """What an engine offers Triton: its inputs (dims, -1 where dynamic), dtypes and profiles."""

    inputs: dict[str, tuple[int, ...]]
    outputs: dict[str, tuple[int, ...]]
    profiles: list[Profile]
    dtypes: dict[str, type] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipe:
    """How one model version's engine is built: which ONNX file, precision, dynamic axes."""

    model: str
    version: str
    onnx: str  # file name inside the version folder
    precision: str
    # Non-batch axes that are dynamic (-1 in the config): input → {axis: (min, opt, max)}.
    dynamic: Mapping[str, Mapping[int, tuple[int, int, int]]] = field(default_factory=dict)
    config_name: str = "gpu"

    def onnx_path(self, repository: Path) -> Path:
        """The source ONNX model."""
        return repository / self.model / self.version / self.onnx

    def reference_path(self, repository: Path) -> Path:
        """The fp32 model every engine of this model is compared with (version 1's ONNX).

        Not the version's own CPU model: encoder version 2 is dynamic INT8, itself an
        approximation of the fp32 model.
        """
        return repository / self.model / "1" / "model.onnx"

    def config_path(self, repository: Path) -> Path:
        """The Triton config the engine must satisfy."""
        return repository / self.model / "configs" / f"{self.config_name}.pbtxt"

    def config(self, repository: Path) -> mc.ModelConfig:
        """That config, parsed with Triton's schema."""
        import model_config

        return model_config.parse(self.config_path(repository))

    def profiles(self, repository: Path) -> list[Profile]:
        """The optimization profiles the engine is built with (``profiles_for`` its config)."""
        return profiles_for(self.config(repository), self.dynamic)

    def plan_path(self, engines: Path) -> Path:
        """Where the engine goes under a folder laid out like the repository."""
        return engines / self.model / self.version / "model.plan"


def sequence_range() -> tuple[int, int, int]:
    """The encoder's token axis: the tokenizer's smallest bucket, a typical sentence, the cap.

    ``opt`` is the bucket a typical short sentence lands in (the sample sentences' median),
    which is the shape most requests have.
    """
    lengths = sorted(len(ids) for ids in tokenization.encode(list(_typical_texts()))[0])
    typical = padding.bucket_length(lengths[len(lengths) // 2])
    return padding.BUCKETS[0], typical, embedding.MAX_TOKENS


def _typical_texts() -> Sequence[str]:
    from export import text_samples

    return text_samples.SENTENCES


def generated_recipes(repository: Path) -> list[Recipe]:
    """The engines of the models ``python -m export torch`` wrote: FP16, and INT8 from version 2.

    Their dynamic axes' ranges are the ones signature.json keeps.
    """
    import json

    from model_config import signatures

    found = []
    for path in sorted(repository.glob(f"*/{signatures.GENERATED}")):
        data = json.loads(path.read_text())
        if not data.get("command"):
            continue  # a Python step of a text service: no graph of its own
        axes = signatures.ranges_of(data)
        model = path.parent.name
        found.append(Recipe(model, "1", "model.onnx", "fp16", axes))
        if data.get("int8"):
            found.append(Recipe(model, "2", "model.onnx", "int8", axes))
    return found


def recipes(repository: Path | None = None) -> list[Recipe]:
    """Every engine the GPU configs expect (model, version, source ONNX, precision).

    The repository's own models, then those ``python -m export torch`` added to ``repository``
    (default: model_repository/).
    """
    from paths import MODEL_REPOSITORY

    seq = sequence_range()
    text_axes = {embedding.INPUT_IDS: {1: seq}, embedding.ATTENTION_MASK: {1: seq}}
    return [
        Recipe(classification.CLASSIFIER, "1", "model.onnx", "fp16"),
        Recipe(embedding.ENCODER, "1", "model.onnx", "fp16", text_axes),
        # INT8 needs explicit quantization (Q/DQ nodes): the CPU model of version 2 is dynamic
        # quantization (MatMulInteger), which TensorRT cannot parse.
        Recipe(embedding.ENCODER, "2", "model.qdq.onnx", "int8", text_axes),
        *generated_recipes(repository or MODEL_REPOSITORY),
    ]


def batch_ranges(max_batch_size: int, preferred: Sequence[int]) -> list[tuple[int, int, int]]:
    """(min, opt, max) batch per profile: one range per preferred size, the last up to the max.

    Each range ends at (and is optimized for) a preferred batch size, because those are the
    batches the dynamic batcher forms; a final range reaches ``max_batch_size`` when it is
    larger than every preferred size.
    """
    if max_batch_size < 1:
        raise ValueError("TensorRT profiles need max_batch_size >= 1 (batching enabled)")
    sizes = sorted({p for p in preferred if 1 <= p <= max_batch_size})
    bad = [p for p in preferred if not 1 <= p <= max_batch_size]
    if bad:
        raise ValueError(f"preferred_batch_size {bad} outside 1..max_batch_size {max_batch_size}")
    if not sizes or sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    ranges, low = [], 1
    for size in sizes:
        ranges.append((low, size, size))
        low = size + 1
    return ranges


def profiles_for(
    config: mc.ModelConfig, dynamic: Mapping[str, Mapping[int, tuple[int, int, int]]] = {}
) -> list[Profile]:
    """The optimization profiles that make an engine serve exactly what ``config`` accepts.

    ``dynamic`` gives (min, opt, max) for non-batch axes that are -1 in the config, keyed by
    the axis index in the full (batched) shape.
    """
    preferred = list(config.dynamic_batching.preferred_batch_size)
    profiles = []
    for low, opt, high in batch_ranges(config.max_batch_size, preferred):
        profile: Profile = {}
        for tensor in config.input:
            dims = (-1, *tensor.dims)
            axes = dynamic.get(tensor.name, {})
            shapes = []
            for pick, batch in ((0, low), (1, opt), (2, high)):
                shape = [batch]
                for axis, size in enumerate(dims[1:], start=1):
                    if size >= 0:
                        shape.append(size)
                    elif axis in axes:
                        shape.append(axes[axis][pick])
                    else:
                        raise ValueError(f"{tensor.name} axis {axis} is dynamic: give its range")
                shapes.append(tuple(shape))
            profile[tensor.name] = Shapes(*shapes)
        profiles.append(profile)
    return profiles
