"""Export PyTorch models into model_repository/.

Examples:
    python -m export efficientnet_lite0 --output model_repository/classifier/1/model.onnx
    python -m export minilm     # encoder/1/model.onnx (fp32) and encoder/2/model.onnx (INT8)
    python -m export embed-graph   # embed_graph/1/model.onnx: tokenizer op + fp32 encoder
    python -m export minilm-compact --output /tmp/minilm.safetensors  # int8 weights, checked
    python -m export samples samples/   # the sample photos the parity checks use, as JPEG files
    python -m export torch --model mypkg.nets:build --input PIXELS:fp32:3,224,224 --name mynet
        # any PyTorch model: ONNX checked against PyTorch, config, variants (docs/your-model.md)
    python -m export sentence --path my-st-model/ --name mytext   # a text service beside embed
    python -m export regenerate   # the graphs of generated models that are missing (make models)

TensorRT engines are built from these graphs by ``python -m export.tensorrt``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from export import (
    efficientnet_lite0,
    minilm,
    onnx_export,
    samples,
    sentence,
    tensor_specs,
    text_graph,
    torch_model,
)
from paths import MODEL_REPOSITORY

log = logging.getLogger("export")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line: which model, where to write it, which opset."""
    parser = argparse.ArgumentParser(
        prog="python -m export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="model", required=True)
    eff = sub.add_parser(
        "efficientnet_lite0",
        help="ImageNet EfficientNet-Lite0 → classifier ONNX (dynamic batch, parity-checked)",
    )
    eff.add_argument("--output", type=Path, default=efficientnet_lite0.DEFAULT_OUTPUT)
    eff.add_argument("--opset", type=int, default=onnx_export.DEFAULT_OPSET)
    eff.add_argument(
        "--weights",
        type=Path,
        help="a compact copy of the pinned weights (.safetensors) instead of the package",
    )
    mini = sub.add_parser(
        "minilm",
        help="all-MiniLM-L6-v2 → encoder ONNX, fp32 and INT8 (dynamic batch and sequence axes)",
    )
    mini.add_argument("--output", type=Path, default=minilm.DEFAULT_OUTPUT)
    mini.add_argument("--int8-output", type=Path, default=minilm.DEFAULT_INT8_OUTPUT)
    mini.add_argument("--qdq-output", type=Path, default=minilm.DEFAULT_QDQ_OUTPUT)
    mini.add_argument("--opset", type=int, default=onnx_export.DEFAULT_OPSET)
    packed = sub.add_parser(
        "minilm-compact",
        help="all-MiniLM-L6-v2's weights, int8/fp16 in one checked file (PyTorch on a GPU)",
    )
    packed.add_argument("--output", type=Path, required=True)
    packed.add_argument("--encoder", type=Path, default=minilm.DEFAULT_OUTPUT)
    packed.add_argument("--min-cosine", type=float, default=minilm.MIN_COSINE_COMPACT)
    graph = sub.add_parser(
        "embed-graph",
        help="tokenizer op (onnxruntime-extensions) + encoder → one TEXT → EMBEDDING graph",
    )
    graph.add_argument("--encoder", type=Path, default=minilm.DEFAULT_OUTPUT)
    graph.add_argument("--output", type=Path, default=text_graph.DEFAULT_OUTPUT)
    own = sub.add_parser(
        "torch",
        help="any PyTorch model → ONNX (checked against PyTorch), config and variants",
        description="Export a PyTorch model with a dynamic batch axis, check it, and write its "
        "folder in the repository: config.pbtxt, the local, gpu, gpu-ort and gpu-local variants, "
        "signature.json. Refuses, before writing anything, what Triton would refuse.",
    )
    torch_model.add_arguments(own)
    text = sub.add_parser(
        "sentence",
        help="a sentence-transformers folder → a text service beside embed (four models)",
    )
    sentence.add_arguments(text)
    again = sub.add_parser(
        "regenerate", help="export again the generated models whose graphs are missing"
    )
    again.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    smp = sub.add_parser("samples", help="write the sample photos (scikit-image/-learn) as JPEGs")
    smp.add_argument("directory", type=Path)
    return parser.parse_args(argv)


def write_samples(directory: Path) -> None:
    """Write every sample photo as <name>.jpg into the directory, for clients to send."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in samples.PHOTOS:
        path = directory / f"{name}.jpg"
        path.write_bytes(samples.photo_bytes(name))
        print(path)


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit status 1 when a parity check fails, 2 when a model is refused."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.model in ("torch", "sentence", "regenerate"):
        try:
            if args.model == "sentence":
                command = torch_model.kept_command(argv)
                sentence.main(
                    args.path, args.name, args.repository, args.max_batch, command, args.replace
                )
            elif args.model == "torch":
                torch_model.main(
                    torch_model.request_from(args, argv), args.repository, args.replace
                )
            else:
                torch_model.regenerate(args.repository)
                sentence.regenerate(args.repository)
        except tensor_specs.SpecError as exc:
            print(f"refused: {exc}", file=sys.stderr)
            return 2
        return 0
    log.info("arguments: %s", vars(args))
    if args.model == "efficientnet_lite0":
        efficientnet_lite0.main(args.output, args.opset, args.weights)
    elif args.model == "minilm":
        minilm.main(args.output, args.int8_output, args.opset, args.qdq_output)
    elif args.model == "minilm-compact":
        minilm.write_compact(args.output, args.encoder, args.min_cosine)
    elif args.model == "embed-graph":
        text_graph.main(args.encoder, args.output)
    elif args.model == "samples":
        write_samples(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
