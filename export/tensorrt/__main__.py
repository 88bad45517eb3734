"""Build TensorRT engines from the repository's ONNX graphs, or print the trtexec commands.

Examples:
    python -m export.tensorrt --commands   # the trtexec commands for every engine (no GPU needed)
    python -m export.tensorrt --engines /engines --parity   # build + check (TensorRT + GPU)
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from export import tensorrt

log = logging.getLogger("export.tensorrt")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line: where the repository and the engines are, what to build."""
    parser = argparse.ArgumentParser(
        prog="python -m export.tensorrt",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument(
        "--engines", type=Path, help="write <model>/<version>/model.plan here (default: in place)"
    )
    parser.add_argument(
        "--timing-cache", type=Path, help="read before and written after each build"
    )
    parser.add_argument("--workspace-mib", type=int, default=tensorrt.DEFAULT_WORKSPACE_MIB)
    parser.add_argument("--only", action="append", help="only these models (repeatable)")
    parser.add_argument(
        "--commands", action="store_true", help="print trtexec commands, build none"
    )
    parser.add_argument(
        "--parity", action="store_true", help="compare each engine with onnxruntime"
    )
    return parser.parse_args(argv)


def build_engines(args: argparse.Namespace) -> int:
    """Print the trtexec commands, or build (and check) engines."""
    chosen = [r for r in tensorrt.recipes(args.repository) if not args.only or r.model in args.only]
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


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit status 2 where engines cannot be built, 1 when a parity check fails."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    log.info("arguments: %s", vars(args))
    try:
        return build_engines(args)
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
