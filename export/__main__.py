"""Export PyTorch models into model_repository/.

Examples:
    python -m export efficientnet_lite0 --output model_repository/classifier/1/model.onnx
    python -m export minilm     # encoder/1/model.onnx (fp32) and encoder/2/model.onnx (INT8)
    python -m export embed-graph   # embed_graph/1/model.onnx: tokenizer op + fp32 encoder
    python -m export tensorrt --commands   # the trtexec commands for every engine (no GPU needed)
    python -m export tensorrt --engines /engines --parity   # build + check (TensorRT + GPU)
    python -m export samples samples/   # the sample photos the parity checks use, as JPEG files
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
    tensorrt,
    text_graph,
)

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
    mini = sub.add_parser(
        "minilm",
        help="all-MiniLM-L6-v2 → encoder ONNX, fp32 and INT8 (dynamic batch and sequence axes)",
    )
    mini.add_argument("--output", type=Path, default=minilm.DEFAULT_OUTPUT)
    mini.add_argument("--int8-output", type=Path, default=minilm.DEFAULT_INT8_OUTPUT)
    mini.add_argument("--qdq-output", type=Path, default=minilm.DEFAULT_QDQ_OUTPUT)
    mini.add_argument("--opset", type=int, default=onnx_export.DEFAULT_OPSET)
    graph = sub.add_parser(
        "embed-graph",
        help="tokenizer op (onnxruntime-extensions) + encoder → one TEXT → EMBEDDING graph",
    )
    graph.add_argument("--encoder", type=Path, default=minilm.DEFAULT_OUTPUT)
    graph.add_argument("--output", type=Path, default=text_graph.DEFAULT_OUTPUT)
    trt = sub.add_parser(
        "tensorrt",
        help="ONNX → TensorRT engines with profiles from configs/gpu.pbtxt (TensorRT 10+, GPU)",
    )
    trt.add_argument("--repository", type=Path, default=Path("model_repository"))
    trt.add_argument(
        "--engines", type=Path, help="write <model>/<version>/model.plan here (default: in place)"
    )
    trt.add_argument("--timing-cache", type=Path, help="read before and written after each build")
    trt.add_argument("--workspace-mib", type=int, default=tensorrt.DEFAULT_WORKSPACE_MIB)
    trt.add_argument("--only", action="append", help="only these models (repeatable)")
    trt.add_argument("--commands", action="store_true", help="print trtexec commands, build none")
    trt.add_argument("--parity", action="store_true", help="compare each engine with onnxruntime")
    smp = sub.add_parser("samples", help="write the sample photos (scikit-image/-learn) as JPEGs")
    smp.add_argument("directory", type=Path)
    return parser.parse_args(argv)


def build_engines(args: argparse.Namespace) -> int:
    """``python -m export tensorrt``: print the trtexec commands, or build (and check) engines."""
    chosen = [r for r in tensorrt.recipes() if not args.only or r.model in args.only]
    engines = args.engines or args.repository
    if args.commands:
        for recipe in chosen:
            command = tensorrt.trtexec_command(
                recipe.onnx_path(args.repository),
                recipe.plan_path(engines),
                recipe.profiles(args.repository),
                recipe.precision,
                args.workspace_mib,
                args.timing_cache,
            )
            print(" ".join(command))
        return 0
    reason = tensorrt.unavailable_reason()
    if reason:
        log.error("cannot build engines here: %s (use --commands to see what would run)", reason)
        return 2
    for recipe in chosen:
        plan = recipe.plan_path(engines)
        tensorrt.build(recipe, args.repository, plan, args.timing_cache, args.workspace_mib)
        log.info("built %s", plan)
        if args.parity:
            tensorrt.parity(recipe, args.repository, plan)
    return 0


def write_samples(directory: Path) -> None:
    """Write every sample photo as <name>.jpg into the directory, for clients to send."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in samples.PHOTOS:
        path = directory / f"{name}.jpg"
        path.write_bytes(samples.photo_bytes(name))
        print(path)


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit status 1 when a parity check fails."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    log.info("arguments: %s", vars(args))
    if args.model == "efficientnet_lite0":
        efficientnet_lite0.main(args.output, args.opset)
    elif args.model == "minilm":
        minilm.main(args.output, args.int8_output, args.opset, args.qdq_output)
    elif args.model == "embed-graph":
        text_graph.main(args.encoder, args.output)
    elif args.model == "tensorrt":
        return build_engines(args)
    elif args.model == "samples":
        write_samples(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
