"""A sentence-embedding model on disk into a text service beside ``embed``.

``python -m export sentence --path DIR --name NAME`` takes a BERT-family encoder in the layout
sentence-transformers saves (config.json and the weights, tokenizer.json, modules.json,
1_Pooling/config.json), loads it with transformers, and writes five models:

* ``NAME_encoder``: the encoder with pooling (mean or CLS, as 1_Pooling says) and, where
  modules.json has it, L2 normalization inside its ONNX graph, checked against the same model in
  PyTorch (cosine >= MIN_COSINE on every sample text); its folder holds the tokenizer.json too;
* ``NAME_tokenize``: texts → ids and masks with that tokenizer (the GPU ensemble's first step);
* ``NAME_tokenize_encode``: the one-step CPU path (tokenize, sort, run the graph) with the
  per-text cache, as ``tokenize_encode`` is for ``embed``;
* ``NAME``: the ensemble clients call: tokenize → encoder, and on the CPU configs the one step;
  ``NAME_with_tokens`` the same with each text's word pieces, which the gateway's OpenAI
  embeddings API serves as the model ``NAME`` (signature.json says so).

The steps are the repository's own (pipelines/backend/text_model.py), given the encoder and the
tokenizer by parameters; texts over ``embedding.MAX_TOKENS`` word pieces are refused unless
their TRUNCATE is set, as for ``embed``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

import model_config
from export import model_files, onnx_export, text_samples, torch_model
from export.tensor_specs import SpecError, check_name
from model_config import signatures
from paths import MODEL_REPOSITORY
from pipelines import embedding, onnx_runner, padding, tokenization
from pipelines.tensors import Signature

log = logging.getLogger(__name__)

# The vectors of the graph against the model's own in PyTorch: fp32 both, the same inputs.
MIN_COSINE = 0.99999
TOKENIZER = "tokenizer.json"
# The token axis the TensorRT profiles cover: the smallest padding bucket, a short sentence,
# the cap every text model here cuts at.
SEQUENCE_RANGE = (padding.BUCKETS[0], padding.BUCKETS[0], embedding.MAX_TOKENS)


class SentenceEncoder(torch.nn.Module):
    """ids and mask → one vector per text: the encoder, pooling, and normalization if asked."""

    def __init__(self, encoder: torch.nn.Module, pooling: str, normalize: bool):
        super().__init__()
        self.encoder, self.pooling, self.normalize = encoder, pooling, normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[batch, hidden] float32."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled


def read_layout(path: Path) -> tuple[str, bool]:
    """The pooling (``mean`` or ``cls``) and whether vectors are normalized, from the folder.

    Raises:
        SpecError: a file sentence-transformers writes is missing, or a pooling not supported.
    """
    for name in ("config.json", TOKENIZER):
        if not (path / name).is_file():
            raise SpecError(f"{path}: no {name} (the layout sentence-transformers saves)")
    modules = path / "modules.json"
    listed = json.loads(modules.read_text()) if modules.is_file() else []
    normalize = any(m.get("type", "").endswith("Normalize") for m in listed)
    pooling_dir = next(
        (path / m["path"] for m in listed if m.get("type", "").endswith("Pooling")),
        path / "1_Pooling",
    )
    config = pooling_dir / "config.json"
    if not config.is_file():
        return "mean", normalize
    modes = {
        k for k, v in json.loads(config.read_text()).items() if k.startswith("pooling_mode") and v
    }
    if modes == {"pooling_mode_mean_tokens"}:
        return "mean", normalize
    if modes == {"pooling_mode_cls_token"}:
        return "cls", normalize
    raise SpecError(f"{config}: pooling {sorted(modes)}; mean tokens or CLS token are supported")


def load(path: Path) -> tuple[SentenceEncoder, int]:
    """The encoder from ``path`` (transformers, local files only) and its vector's width."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    positions = getattr(config, "max_position_embeddings", 0)
    if positions < embedding.MAX_TOKENS:
        raise SpecError(
            f"{path}: {positions} positions; the text services embed up to "
            f"{embedding.MAX_TOKENS} word pieces"
        )
    pooling, normalize = read_layout(path)
    encoder = AutoModel.from_pretrained(path, local_files_only=True).eval()
    return SentenceEncoder(encoder, pooling, normalize).eval(), int(config.hidden_size)


def parity_texts() -> list[str]:
    """The sample sentences, a long text (cut at the limit) and mixed-length ones."""
    return [*text_samples.SENTENCES, text_samples.LONG_TEXT, *text_samples.mixed_texts(20, seed=3)]


def check_parity(model: SentenceEncoder, graph: Path, tokenizer_path: Path, sha256: str) -> float:
    """The smallest cosine between the graph's vectors and PyTorch's, per padded batch."""
    tok = tokenization.tokenizer(str(tokenizer_path), sha256)
    tokens, _ = tokenization.encode_counted(parity_texts(), tok)
    session = onnx_runner.create_session(graph, intra_op_threads=2)
    lowest = 1.0
    for start in range(0, len(tokens), 8):
        ids, mask = padding.pad(tokens[start : start + 8])
        with torch.inference_mode():
            want = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        got = onnx_runner.run(session, feeds, [embedding.EMBEDDING])[0]
        lowest = min(lowest, torch_model.min_row_cosine(want, got))
    if lowest < MIN_COSINE:
        raise SpecError(
            f"parity: the graph's vectors reach a cosine of {lowest:.7f} (< {MIN_COSINE})"
        )
    log.info("parity: %d texts, min cosine to PyTorch %.7f", len(tokens), lowest)
    return lowest


def widened(signature: Signature, width: int) -> Signature:
    """``signature`` with its EMBEDDING output ``width`` floats wide (MiniLM's are 384)."""
    outputs = tuple(
        dataclasses.replace(t, dims=(width,)) if t.name == embedding.EMBEDDING else t
        for t in signature.outputs
    )
    return Signature(signature.inputs, outputs)


def _signature(folder: Path, signature: Signature, ranges=None, command=()) -> None:
    (folder / model_files.SIGNATURE).write_text(
        model_files.signature_json(signature, ranges or {}, False, command)
    )


def _python_step(folder: Path, adapter: str, config: str) -> None:
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(adapter)
    (folder / model_config.BASE).write_text(config)


TEXT_IN = """input [
  { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "TRUNCATE", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }
]"""
STEP_ADAPTER = '''"""Triton adapter: pipelines/backend/text_model.py's {cls}, for {service}."""

from pipelines.backend.text_model import {cls} as TritonPythonModel

__all__ = ["TritonPythonModel"]
'''


def write_service(
    staging: Path, name: str, width: int, sha256: str, local_names: Sequence[str]
) -> dict[str, Signature]:
    """The three folders around ``NAME_encoder`` (already in ``staging``); their signatures."""
    encoder, tokenize, one_step = f"{name}_encoder", f"{name}_tokenize", f"{name}_tokenize_encode"
    tokenizer_file = f"../{encoder}/{TOKENIZER}"  # relative to the step's folder
    tokenizer_params = (
        f'parameters {{ key: "tokenizer", value: {{ string_value: "{tokenizer_file}" }} }}\n'
        f'parameters {{ key: "tokenizer_sha256", value: {{ string_value: "{sha256}" }} }}'
    )
    # embed's own steps' signatures, with this model's width.
    made = {
        tokenize: embedding.SIGNATURES[embedding.TOKENIZE],
        one_step: widened(embedding.SIGNATURES[embedding.TOKENIZE_ENCODE], width),
        name: widened(embedding.SIGNATURES[embedding.ENSEMBLE], width),
        f"{name}_with_tokens": widened(
            embedding.SIGNATURES[embedding.OPENAI_MODELS[embedding.ENSEMBLE]], width
        ),
    }
    _python_step(
        staging / tokenize,
        STEP_ADAPTER.format(cls="TokenizeModel", service=name),
        f"""# Texts → word-piece ids and masks with {name}'s own tokenizer: the GPU ensemble's
# first step.
name: "{tokenize}"
backend: "python"
max_batch_size: {embedding.MAX_TEXTS}
{TEXT_IN}
output [
  {{ name: "INPUT_IDS", data_type: TYPE_INT64, dims: [ -1 ] }},
  {{ name: "ATTENTION_MASK", data_type: TYPE_INT64, dims: [ -1 ] }},
  {{ name: "TOKENS", data_type: TYPE_INT32, dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
{tokenizer_params}
""",
    )
    _python_step(
        staging / one_step,
        STEP_ADAPTER.format(cls="TokenizeEncodeModel", service=name),
        f"""# Texts → {name}'s vectors in one Python step on the CPU: its tokenizer, then
# {encoder}/1/model.onnx on length-sorted sub-batches, behind the per-text cache (64 MiB here;
# the Redis at $EMBED_TEXT_CACHE_URL when the launcher gives one). As tokenize_encode for embed.
name: "{one_step}"
backend: "python"
max_batch_size: {embedding.MAX_TEXTS}
{TEXT_IN}
output [
  {{ name: "EMBEDDING", data_type: TYPE_FP32, dims: [ {width} ] }},
  {{ name: "TOKENS", data_type: TYPE_INT32, dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
parameters {{ key: "encoder", value: {{ string_value: "{encoder}" }} }}
{tokenizer_params}
parameters {{ key: "max_batch_tokens", value: {{ string_value: "2048" }} }}
parameters {{ key: "intra_op_thread_count", value: {{ string_value: "2" }} }}
parameters {{ key: "inter_op_thread_count", value: {{ string_value: "1" }} }}
parameters {{ key: "text_cache_bytes", value: {{ string_value: "67108864" }} }}
""",
    )
    for ensemble, counted in ((name, False), (f"{name}_with_tokens", True)):
        _ensemble(staging / ensemble, name, width, counted, local_names)
    for folder, signature in made.items():
        _signature(staging / folder, signature)
    # The gateway serves OpenAI's embeddings API for it under its name (gateway.nginx.config).
    listed = json.loads((staging / name / model_files.SIGNATURE).read_text())
    listed["openai"] = {"ensemble": f"{name}_with_tokens", "dimensions": width}
    (staging / name / model_files.SIGNATURE).write_text(json.dumps(listed, indent=2) + "\n")
    return made


def _ensemble(folder: Path, name: str, width: int, counted: bool, local_names) -> None:
    """NAME (vectors) or NAME_with_tokens (and each text's word pieces, for OpenAI's usage)."""
    tokenize, encoder, one_step = f"{name}_tokenize", f"{name}_encoder", f"{name}_tokenize_encode"
    tokens_out = '  { name: "TOKENS", data_type: TYPE_INT32, dims: [ 1 ] }\n' if counted else ""
    tokens_map = '      output_map { key: "TOKENS", value: "TOKENS" }\n' if counted else ""
    what = "and each text's word pieces (OpenAI's usage)" if counted else "out"
    (folder / "configs").mkdir(parents=True)
    (folder / "1").mkdir()  # an ensemble's version folder is empty
    (folder / model_config.BASE).write_text(
        f"""# Text in → {name}'s sentence vector {what}: {tokenize} → {encoder}, which pools
# (and normalizes) inside its graph; made by `python -m export sentence`. Repeated texts are
# answered from Triton's response cache. configs/local.overlay.pbtxt: the CPU's one step.
name: "{folder.name}"
platform: "ensemble"
max_batch_size: {embedding.MAX_TEXTS}
{TEXT_IN}
output [
  {{ name: "EMBEDDING", data_type: TYPE_FP32, dims: [ {width} ] }}{"," if counted else ""}
{tokens_out}]
response_cache {{ enable: true }}
ensemble_scheduling {{
  step [
    {{
      model_name: "{tokenize}"
      model_version: -1
      input_map {{ key: "TEXT", value: "TEXT" }}
      input_map {{ key: "TRUNCATE", value: "TRUNCATE" }}
      output_map {{ key: "INPUT_IDS", value: "input_ids" }}
      output_map {{ key: "ATTENTION_MASK", value: "attention_mask" }}
{tokens_map}    }},
    {{
      model_name: "{encoder}"
      model_version: 1
      input_map {{ key: "INPUT_IDS", value: "input_ids" }}
      input_map {{ key: "ATTENTION_MASK", value: "attention_mask" }}
      output_map {{ key: "EMBEDDING", value: "EMBEDDING" }}
    }}
  ]
}}
"""
    )
    (folder / "configs" / f"local{model_config.OVERLAY}").write_text(
        f"""# The CPU: one Python step that tokenizes and runs the encoder graph on the whole batch
# ({one_step}), not two steps whose hand-over costs more than the batch it forms
# (docs/models.md, "One step on the CPU"). gpu-local and the local-* variants link here.
ensemble_scheduling {{
  step [
    {{
      model_name: "{one_step}"
      model_version: 1
      input_map {{ key: "TEXT", value: "TEXT" }}
      input_map {{ key: "TRUNCATE", value: "TRUNCATE" }}
      output_map {{ key: "EMBEDDING", value: "EMBEDDING" }}
{tokens_map}    }}
  ]
}}
"""
    )
    model_files.link_to_local(folder / "configs", local_names)


def main(
    path: Path,
    name: str,
    repository: Path,
    max_batch: int,
    command: Sequence[str] = (),
    replace: bool = False,
) -> list[Path]:
    """Export, check and publish the five models; their folders."""
    check_name(name, "--name")
    names = [
        name,
        f"{name}_with_tokens",
        f"{name}_encoder",
        f"{name}_tokenize",
        f"{name}_tokenize_encode",
    ]
    taken = [n for n in names if (repository / n).exists()]
    if taken and not replace:
        raise SpecError(f"{repository}: {taken} exist: choose another --name, or --replace them")
    model, width = load(path)
    sha256 = hashlib.sha256((path / TOKENIZER).read_bytes()).hexdigest()
    with torch_model.scratch(repository) as tmp:
        staging = Path(tmp)
        encoder_dir = staging / f"{name}_encoder"
        graph = encoder_dir / "1" / "model.onnx"
        export_graph(model, graph, path / TOKENIZER, sha256)
        shutil.copyfile(path / TOKENIZER, encoder_dir / TOKENIZER)
        encoder_signature = widened(embedding.SIGNATURES[embedding.ENCODER], width)
        ranges = {t.name: {1: SEQUENCE_RANGE} for t in encoder_signature.inputs}
        local_names = model_files.local_variants(repository)
        model_files.write(
            encoder_dir,
            f"{name}_encoder",
            encoder_signature,
            ranges,
            max_batch,
            ["1"],
            command,
            local_names,
        )
        write_service(staging, name, width, sha256, local_names)
        found = model_files.problems(encoder_dir, encoder_signature, ranges)
        found += signatures.check_repository(staging)
        if found:
            raise RuntimeError("generated files fail their checks:\n" + "\n".join(found))
        for n in names:
            torch_model.publish(staging / n, repository / n, replace)
    model_config.render_repository(repository, models=names)
    return [repository / n for n in names]


def export_graph(model: SentenceEncoder, graph: Path, tokenizer_path: Path, sha256: str) -> float:
    """The encoder's ONNX graph (dynamic batch and token axes) at ``graph``, checked."""
    graph.parent.mkdir(parents=True, exist_ok=True)
    tok = tokenization.tokenizer(str(tokenizer_path), sha256)
    ids, mask = padding.pad(tokenization.encode_counted(text_samples.SENTENCES[:2], tok)[0])
    onnx_export.export(
        model,
        (torch.from_numpy(ids), torch.from_numpy(mask)),
        graph,
        [embedding.INPUT_IDS, embedding.ATTENTION_MASK],
        [embedding.EMBEDDING],
        {
            embedding.INPUT_IDS: {0: "batch", 1: "sequence"},
            embedding.ATTENTION_MASK: {0: "batch", 1: "sequence"},
            embedding.EMBEDDING: {0: "batch"},
        },
    )
    return check_parity(model, graph, tokenizer_path, sha256)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``sentence`` subcommand's options."""
    parser.add_argument(
        "--path",
        type=Path,
        required=True,
        help="the model's folder (sentence-transformers' layout)",
    )
    parser.add_argument("--name", required=True, help="the service's name (and its steps' prefix)")
    parser.add_argument(
        "--max-batch", type=int, default=embedding.MAX_TEXTS, help="the encoder's max_batch_size"
    )
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--replace", action="store_true", help="replace the service's models")


def regenerate(repository: Path) -> list[Path]:
    """Export again every text service's graph that is missing, from the command it keeps.

    The tokenizer is the copy in the encoder's folder (the one the steps read); the configs are
    the user's and stay as they are.
    """
    done = []
    for path in sorted(repository.glob(f"*/{model_files.SIGNATURE}")):
        command = json.loads(path.read_text()).get("command", [])
        folder = path.parent
        if command[:1] != ["sentence"] or (folder / "1" / "model.onnx").is_file():
            continue
        parser = argparse.ArgumentParser(prog="python -m export sentence")
        add_arguments(parser)
        args = parser.parse_args(list(command[1:]))
        model, _ = load(args.path)
        sha256 = hashlib.sha256((folder / TOKENIZER).read_bytes()).hexdigest()
        with torch_model.scratch(repository) as tmp:
            staged = Path(tmp) / "model.onnx"
            export_graph(model, staged, folder / TOKENIZER, sha256)
            os.replace(staged, folder / "1" / "model.onnx")
        log.info("exported %s again", folder)
        done.append(folder)
    return done
