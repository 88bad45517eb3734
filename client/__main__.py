"""Command-line client of the served models.

Examples:
    python -m client classify cat.jpg dog.png --top-k 3
    python -m client classify cat.jpg --protocol grpc --url localhost:8001
    python -m client samples samples/      # write the bundled sample photos as JPEG files
    python -m client perf [--full]         # benchmark: perf_analyzer, raw engine, peer; report
    python -m client tune classifier --p99-ms 40   # SLO tuner: writes configs/local-tuned.pbtxt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from client import connection
from client.classify import ClassifyClient
from client.perf import cli as perf_cli
from pipelines import classification as spec


def _add_connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", help="host:port of the server (default: localhost:8000 http, :8001 grpc)"
    )
    parser.add_argument("--protocol", choices=connection.PROTOCOLS, default="http")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line: one subcommand per task."""
    parser = argparse.ArgumentParser(
        prog="python -m client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cls = sub.add_parser("classify", help="top-k ImageNet labels for image files")
    cls.add_argument("images", nargs="+", type=Path, help="image files (JPEG, PNG, WebP, ...)")
    cls.add_argument(
        "--top-k",
        type=int,
        default=None,
        help=f"classes per image (server default {spec.DEFAULT_TOP_K})",
    )
    _add_connection_args(cls)
    perf_cli.add_parser(sub)
    perf_cli.add_tune_parser(sub)
    smp = sub.add_parser("samples", help="write the sample photos (scikit-image/-learn) as JPEGs")
    smp.add_argument("directory", type=Path)
    return parser.parse_args(argv)


def classify(args: argparse.Namespace) -> int:
    """Send all images in one request and print each one's labels and scores."""
    try:
        images = [path.read_bytes() for path in args.images]
    except OSError as exc:
        raise connection.ClientError(f"cannot read {exc.filename}: {exc.strerror}") from None
    with ClassifyClient(args.url, args.protocol) as client:
        client.check_ready()
        predictions = client.classify(images, top_k=args.top_k)
    for path, prediction in zip(args.images, predictions, strict=True):
        print(path)
        for label, score, class_id in zip(
            prediction.labels, prediction.scores, prediction.class_ids, strict=True
        ):
            print(f"  {score:7.4f}  {label} ({class_id})")
    return 0


def samples(args: argparse.Namespace) -> int:
    """Write every sample photo as <name>.jpg into the directory."""
    from pipelines import samples as sample_photos

    args.directory.mkdir(parents=True, exist_ok=True)
    for name in sample_photos.PHOTOS:
        path = args.directory / f"{name}.jpg"
        path.write_bytes(sample_photos.photo_bytes(name))
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 0 on success, 1 with a one-line message on a known failure."""
    args = parse_args(argv)
    commands = {
        "classify": classify,
        "samples": samples,
        "perf": perf_cli.run,
        "tune": perf_cli.tune_run,
    }
    try:
        return commands[args.command](args)
    except connection.ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
