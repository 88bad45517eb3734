"""``python -m bench.peers.microbatcher``: serve a model until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from bench.peers.microbatcher.app import create_app
from bench.peers.microbatcher.models import DEFAULT_EMBED_MODEL, DEFAULT_MODEL, MODEL_NAME, MODELS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The CLI's options, checked; ``model`` is the served model's default file when not given.

    Exits with a usage error for values out of range or a missing model file.
    """
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.microbatcher",
        description="The classifier or the text embedding on FastAPI + uvicorn with an asyncio "
        "micro-batcher, speaking the KServe v2 HTTP protocol (a peer baseline for perf_analyzer).",
    )
    parser.add_argument(
        "--model-name",
        choices=sorted(MODELS),
        default=MODEL_NAME,
        help="the model served, under this name (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help=f"ONNX file (default: {DEFAULT_MODEL} for classifier, {DEFAULT_EMBED_MODEL} "
        "for embed)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8010, help="HTTP port (default: %(default)s)")
    parser.add_argument(
        "--threads", type=int, default=1, help="onnxruntime intra-op threads (default: 1)"
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="most rows per model run (default: the model's max_batch_size, "
        + ", ".join(f"{m.max_batch} for {m.name}" for m in MODELS.values())
        + ")",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        help="how long a batch waits for more requests after its first (default: 2.0)",
    )
    parser.add_argument(
        "--null", action="store_true", help="answer zeros without running the model"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    args = parser.parse_args(argv)
    model = MODELS[args.model_name]
    args.max_batch = args.max_batch if args.max_batch is not None else model.max_batch
    if args.max_batch < 1 or args.max_wait_ms < 0 or args.threads < 1:
        parser.error("--max-batch and --threads must be >= 1, --max-wait-ms >= 0")
    args.model = args.model or model.default_path
    if not args.null and not args.model.is_file():
        parser.error(f"model not found: {args.model} (run `make models`, or pass --null)")
    return args


def main(argv: list[str] | None = None) -> int:
    """CLI: serve the classifier or the embedding (or the null model) until SIGTERM or Ctrl-C."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    import uvicorn  # the server is only needed here, not by importers of create_app

    app = create_app(
        None if args.null else args.model,
        args.threads,
        args.max_batch,
        args.max_wait_ms,
        args.model_name,
    )
    print(f"peer serving on http://{args.host}:{args.port}/v2/models/{args.model_name}", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        workers=1,
        access_log=False,  # a log line per request would cost more than some requests
        log_level="warning" if args.log_level != "debug" else "debug",
        timeout_graceful_shutdown=5,
    )
    return 0
