"""Command-line client of the served models.

Examples:
    python -m client classify cat.jpg dog.png --top-k 3
    python -m client classify cat.jpg --protocol grpc --url localhost:8001
    python -m client embed "A man is eating food." "A man is riding a horse."
    python -m client embed --file texts.jsonl --out vectors.npy --protocol grpc
    python -m client infer mynet inputs.npz --out outputs.npz   # any model, arrays by name
    TRITON_API_KEY=<key> python -m client embed "a text" --url gateway:8080 --ca-file ca.pem

Through a gateway: the tenant's key from $TRITON_API_KEY (or --api-key, which others on the
machine can read in its process list), sent as x-api-key; --ca-file speaks TLS and trusts the
CA in that file (the system's bundle, e.g. /etc/ssl/certs/ca-certificates.crt, for a
publicly signed certificate).

Benchmarks and the SLO tuner are ``python -m bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import numpy as np

from client import connection, tensors
from client import embed as embed_client
from client.classify import ClassifyClient
from pipelines import classification, embedding


def _add_connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", help="host:port of the server (default: localhost:8000 http, :8001 grpc)"
    )
    parser.add_argument("--protocol", choices=connection.PROTOCOLS, default="http")
    parser.add_argument(
        "--priority",
        type=int,
        default=0,
        help="request priority where a model has priority levels (1 first; 0: its default), "
        "e.g. interactive 1 on a server run with --model-config-name=local-shared",
    )
    connection.Access.add_arguments(parser)


def _connect(client_class, args: argparse.Namespace):
    """A client of ``client_class`` for the model, server, priority and access asked for."""
    access = connection.Access.from_arguments(args)
    return client_class(args.url, args.protocol, args.model, args.priority, access=access)


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
        help=f"classes per image (server default {classification.DEFAULT_TOP_K})",
    )
    cls.add_argument(
        "--model",
        default=classification.ENSEMBLE,
        choices=(classification.ENSEMBLE, classification.FUSED),
        help=f"the ensemble, or {classification.FUSED} "
        "(the same pipeline in one step, for the CPU)",
    )
    _add_connection_args(cls)
    emb = sub.add_parser(
        "embed",
        help="sentence embeddings: texts as arguments (JSONL to stdout) or a JSONL file",
        description="Embeds texts with the embed ensemble. With --file, sends concurrent "
        "batched requests (asyncio) and writes JSONL or .npy. A text over 256 word pieces is "
        "refused by the server (naming it) unless --truncate asks to embed its first 256.",
    )
    emb.add_argument(
        "--truncate", action="store_true", help="embed the first 256 word pieces of longer texts"
    )
    emb.add_argument("texts", nargs="*", help="texts to embed")
    emb.add_argument("--file", type=Path, help='JSONL input: a string or {"text": ...} per line')
    emb.add_argument("--out", type=Path, help="output .jsonl or .npy (with --file)")
    emb.add_argument("--model", default=embedding.ENSEMBLE, help="embed or embed_int8")
    emb.add_argument("--batch-size", type=int, default=32)
    emb.add_argument("--concurrency", type=int, default=8)
    _add_connection_args(emb)
    inf = sub.add_parser(
        "infer",
        help="any model by name: inputs from a .npz (an array per input) or .npy, outputs out",
    )
    inf.add_argument("model", help="the model's name, e.g. one `python -m export torch` made")
    inf.add_argument(
        "inputs", type=Path, help=".npz with an array per input name (batch axis first), or .npy"
    )
    inf.add_argument("--out", type=Path, help="write the outputs to this .npz (default: print)")
    _add_connection_args(inf)
    return parser.parse_args(argv)


def classify(args: argparse.Namespace) -> int:
    """Send all images in one request and print each one's labels and scores."""
    try:
        images = [path.read_bytes() for path in args.images]
    except OSError as exc:
        raise connection.ClientError(f"cannot read {exc.filename}: {exc.strerror}") from None
    with _connect(ClassifyClient, args) as client:
        client.check_ready()
        predictions = client.classify(images, top_k=args.top_k)
    for path, prediction in zip(args.images, predictions, strict=True):
        print(path)
        for label, score, class_id in zip(
            prediction.labels, prediction.scores, prediction.class_ids, strict=True
        ):
            print(f"  {score:7.4f}  {label} ({class_id})")
    return 0


def embed(args: argparse.Namespace) -> int:
    """Embed the argument texts (JSONL on stdout) or a whole file (concurrent batches)."""
    if args.file:
        if not args.out:
            raise connection.ClientError("--file needs --out (.jsonl or .npy)")
        texts = embed_client.read_texts(args.file)

        async def run():
            async with _connect(embed_client.AsyncEmbedClient, args) as c:
                await c.check_ready()
                return await embed_client.embed_many(
                    c,
                    texts,
                    args.batch_size,
                    args.concurrency,
                    embed_client.Progress(),
                    args.truncate,
                )

        vectors = asyncio.run(run())
        embed_client.write_embeddings(args.out, texts, vectors)
        print(f"{len(texts)} embeddings -> {args.out}", file=sys.stderr)
        return 0
    if not args.texts:
        raise connection.ClientError("give texts as arguments, or --file")
    with _connect(embed_client.EmbedClient, args) as client:
        client.check_ready()
        vectors = client.embed(args.texts, args.truncate)
    for text, vector in zip(args.texts, vectors, strict=True):
        print(json.dumps({"text": text, "embedding": [round(float(x), 7) for x in vector]}))
    return 0


def infer(args: argparse.Namespace) -> int:
    """Send the file's arrays in one request; print each output's shape and values, or save them."""
    arrays = tensors.read_arrays(args.inputs)
    with _connect(tensors.TensorClient, args) as client:
        client.check_ready()
        outputs = client.infer_arrays(tensors.with_input_names(arrays, client.metadata()))
    if args.out:
        np.savez(args.out, **outputs)
        print(f"{', '.join(outputs)} -> {args.out}", file=sys.stderr)
        return 0
    for name, array in outputs.items():
        print(json.dumps({"output": name, "shape": list(array.shape), "data": array.tolist()}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 0 on success, 1 with a one-line message on a known failure."""
    args = parse_args(argv)
    commands = {
        "classify": classify,
        "embed": embed,
        "infer": infer,
    }
    try:
        return commands[args.command](args)
    except connection.ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
