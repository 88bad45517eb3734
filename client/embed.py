"""Client of the ``embed`` ensemble: texts in, unit-length 384-d embeddings out.

Example:
    with EmbedClient("localhost:8001", protocol="grpc") as client:
        vectors = client.embed(["A man is eating food.", "A man is riding a horse."])
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from client import connection
from pipelines import embedding


def build_inputs(mod, texts: Sequence[str | bytes], truncate: bool = False) -> list:
    """One TEXT item per text (UTF-8 bytes), binary tensor data over HTTP.

    ``truncate``: a text over the model's word pieces is embedded from its first ones instead
    of refused (the server refuses it by default, naming it).
    """
    if not texts:
        raise connection.ClientError("no texts given")
    items = [t.encode("utf-8") if isinstance(t, str) else bytes(t) for t in texts]
    batch = np.array(items, dtype=np.object_).reshape(-1, 1)
    inputs = [connection.make_input(mod, embedding.TEXT, batch, "BYTES")]
    if truncate:
        flags = np.ones((len(items), 1), dtype=bool)
        inputs.append(connection.make_input(mod, embedding.TRUNCATE, flags, "BOOL"))
    return inputs


def parse(result) -> np.ndarray:
    """float32 [n, 384] from an InferResult."""
    return result.as_numpy(embedding.EMBEDDING)


class EmbedClient(connection.ModelClient):
    """Synchronous client (HTTP or gRPC)."""

    default_model = embedding.ENSEMBLE

    def embed(self, texts: Sequence[str | bytes], truncate: bool = False) -> np.ndarray:
        """Embeddings of ``texts`` in one request (up to the model's max_batch_size)."""
        outputs = connection.make_outputs(self.mod, [embedding.EMBEDDING])
        return parse(self.infer(build_inputs(self.mod, texts, truncate), outputs))


class AsyncEmbedClient(connection.AsyncModelClient):
    """asyncio client (HTTP or gRPC)."""

    default_model = embedding.ENSEMBLE

    async def embed(self, texts: Sequence[str | bytes], truncate: bool = False) -> np.ndarray:
        """Embeddings of ``texts`` in one request."""
        outputs = connection.make_outputs(self.mod, [embedding.EMBEDDING])
        return parse(await self.infer(build_inputs(self.mod, texts, truncate), outputs))


def read_texts(path: Path) -> list[str]:
    """JSONL: one JSON string, or an object with a "text" field, per line."""
    texts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise connection.ClientError(f"{path}:{number}: not JSON ({exc.msg})") from None
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise connection.ClientError(
                    f'{path}:{number}: expected a string or {{"text": ...}}'
                )
            texts.append(text)
    return texts


async def embed_many(
    client: AsyncEmbedClient,
    texts: Sequence[str],
    batch_size: int = 32,
    concurrency: int = 8,
    progress: Callable[[int, int], None] | None = None,
    truncate: bool = False,
) -> np.ndarray:
    """Embed many texts with ``concurrency`` batched requests in flight; order is kept."""
    batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
    results: list[np.ndarray | None] = [None] * len(batches)
    gate = asyncio.Semaphore(concurrency)
    done = 0

    async def one(index: int) -> None:
        nonlocal done
        async with gate:
            results[index] = await client.embed(batches[index], truncate)
        done += len(batches[index])
        if progress:
            progress(done, len(texts))

    await asyncio.gather(*(one(i) for i in range(len(batches))))
    return np.concatenate(results) if results else np.zeros((0, embedding.HIDDEN_SIZE), np.float32)


class Progress:
    """A one-line progress bar on stderr, with the rate since it was made."""

    def __init__(self, width: int = 30):
        self.width = width
        self.started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        """Redraw for ``done`` of ``total`` texts."""
        rate = done / max(time.monotonic() - self.started, 1e-9)
        filled = int(self.width * done / total) if total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r[{bar}] {done}/{total} {rate:,.0f} texts/s")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def write_embeddings(path: Path, texts: Sequence[str], vectors: np.ndarray) -> None:
    """``.npy`` (float32 [n, 384]) or JSONL ({"text", "embedding"} per line)."""
    if path.suffix == ".npy":
        np.save(path, vectors)
        return
    with open(path, "w", encoding="utf-8") as f:
        for text, vector in zip(texts, vectors, strict=True):
            f.write(json.dumps({"text": text, "embedding": [round(float(x), 7) for x in vector]}))
            f.write("\n")
