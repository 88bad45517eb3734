"""Export PyTorch models into model_repository/.

Example:
    python -m export efficientnet_lite0 --output model_repository/classifier/1/model.onnx
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from export import efficientnet_lite0, onnx_export

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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit status 1 when the parity check fails."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    log.info("arguments: %s", vars(args))
    if args.model == "efficientnet_lite0":
        efficientnet_lite0.main(args.output, args.opset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
