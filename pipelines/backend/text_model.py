"""The text models' Python-backend adapters: tokenize, and tokenize_encode (text → embedding).

tokenize_encode exists for the CPU, where a second Python stub per request (tokenize, then an
encoder stub) costs more than the batch it forms: one execute tokenizes every text of every
request at once, sorts them by length into sub-batches of at most ``max_batch_tokens`` padded
positions (``pipelines.padding.encode_sorted``) and runs the encoder's own ``model.onnx`` on
onnxruntime. Versions follow the encoder's: version N opens ``encoder/N/model.onnx``.

Where Triton serves the encoder on a native backend (TensorRT or onnxruntime, in the NGC
container: ``encoder_backend: "triton"``), the step calls that model through BLS instead of
running the graph itself, one request per sub-batch (``pipelines.backend.engines`` opens
either).

In front of the encoder it keeps a per-text cache (``pipelines.text_cache``): its own LRU of
``text_cache_bytes``, and the Redis at ``$EMBED_TEXT_CACHE_URL`` when the launcher gives one.
Only texts neither layer has are tokenized and encoded, once each however often they repeat in
the batch; the answer is the same vectors as without the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import numpy as np

from pipelines import embedding, minilm_weights, padding, text_cache, tokenization
from pipelines.backend import batching as bk
from pipelines.backend import engines, metrics


def token_counts(tokens: list[list[int]]) -> np.ndarray:
    """TOKENS of each text, [n, 1] int32: what OpenAI's ``usage.prompt_tokens`` adds up."""
    return np.array([[len(t)] for t in tokens], dtype=np.int32).reshape(-1, 1)


class TokenizeModel:
    """tokenize: UTF-8 texts → word-piece ids and masks, each request padded to its own bucket.

    Every text of every request goes through one tokenizer call; a bad text fails only its
    own request.
    """

    def initialize(self, args):
        """Load the tokenizer before the first request; create this instance's metrics."""
        self.name = args["model_name"]
        tokenization.tokenizer()
        self.metrics = metrics.TokenizeMetrics(args)

    def finalize(self):
        """Release the metric series before the stub exits."""
        self.metrics.close()

    def _parse(self, request) -> list[str]:
        try:
            return tokenization.decode_texts(bk.input_array(request, embedding.TEXT))
        except tokenization.TextError as exc:
            self.metrics.failed([exc])
            raise bk.RequestError(str(exc)) from None

    def _run(self, items: list[list[str]]) -> list[dict]:
        tokens, truncated = tokenization.encode([t for texts in items for t in texts])
        outputs, start, padded = [], 0, 0
        for texts in items:
            # Each request padded to the bucket of its own longest text.
            mine = tokens[start : start + len(texts)]
            ids, mask = padding.pad(mine)
            start += len(texts)
            padded += ids.size
            outputs.append(
                {
                    embedding.INPUT_IDS: ids,
                    embedding.ATTENTION_MASK: mask,
                    embedding.TOKENS: token_counts(mine),
                }
            )
        self.metrics.batch(sum(map(len, tokens)), padded, truncated)
        return outputs

    def execute(self, requests):
        """One response per request, in order."""
        return bk.execute(requests, self._parse, self._run, model=self.name, rows=len)


class TokenizeEncodeModel(TokenizeModel):
    """tokenize_encode: texts → embeddings; a bad text fails only its own request."""

    def initialize(self, args):
        """Open the encoder of this version (its graph, or Triton's model), then the tokenizer."""
        params = bk.parameters(args)
        version = args["model_version"]
        graph = Path(args["model_repository"]).parent / embedding.ENCODER / version / "model.onnx"
        max_rows = int(params.get("encoder_max_batch", str(embedding.MAX_TEXTS)))
        self.engine = engines.open_engine(
            graph,
            [embedding.EMBEDDING],
            params,
            runtime=params.get("encoder_backend", "onnxruntime"),
            served=engines.Served(embedding.ENCODER, int(version), max_rows),
        )
        self.max_tokens = int(params.get("max_batch_tokens", padding.MAX_BATCH_TOKENS))
        super().initialize(args)
        self.cache = text_cache_for(args, params, self.engine)
        self.cache_metrics = metrics.TextCacheMetrics(args) if self.cache else None

    def finalize(self):
        """Release the metric series before the stub exits."""
        if self.cache_metrics is not None:
            self.cache_metrics.close()
        super().finalize()

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(vectors [n, 384], word pieces [n]) of texts, through the encoder, counted."""
        tokens, truncated = tokenization.encode(texts)
        vectors, padded = padding.encode_sorted(self._encoder, tokens, self.max_tokens)
        self.metrics.batch(sum(map(len, tokens)), padded, truncated)
        return vectors, np.array([len(t) for t in tokens], dtype=np.int32)

    def _encoder(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Embeddings [n, 384] of padded rows, in their order."""
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        return self.engine(feeds)[0]

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's vector and word pieces: from the cache where it has them."""
        if self.cache is None:
            return self._encode(texts)
        found, looked = self.cache.lookup(texts)
        # Each text still missing is encoded once, however often it repeats in the batch.
        todo = list(dict.fromkeys(t for t, hit in zip(texts, found, strict=True) if hit is None))
        outcomes = [looked]
        if todo:
            vectors, counts = self._encode(todo)
            outcomes.append(self.cache.store(todo, vectors, counts))
            new = dict(zip(todo, zip(vectors, counts, strict=True), strict=True))
            found = [
                hit if hit is not None else new[t] for t, hit in zip(texts, found, strict=True)
            ]
        shared = self.cache.shared
        self.cache_metrics.record(outcomes, shared.open if shared is not None else None)
        return (
            np.stack([vector for vector, _ in found]),
            np.array([n for _, n in found], dtype=np.int32),
        )

    def _run(self, items: list[list[str]]) -> list[dict]:
        vectors, counts = self._embed([t for texts in items for t in texts])
        sizes = [len(texts) for texts in items]
        parts = bk.split_rows(vectors, sizes, embedding.EMBEDDING)
        counts = bk.split_rows(counts.reshape(-1, 1), sizes, embedding.TOKENS)
        return [
            {embedding.EMBEDDING: p, embedding.TOKENS: c}
            for p, c in zip(parts, counts, strict=True)
        ]

    def execute(self, requests):
        """Every text of every request in one tokenizer call and sorted encoder runs."""
        return bk.execute(requests, self._parse, self._run, model=self.name, rows=len, isolate=True)


class TextRowsModel:
    """texts_as_batch: a 1-D batch of texts [N] → embed's rows [N, 1], nothing else.

    The texts are checked where they are embedded; here only their count: none, or more than
    embed takes in one request (``embedding.MAX_TEXTS``), is this request's error.
    """

    def initialize(self, args):
        """Keep the model's name for error messages."""
        self.name = args["model_name"]

    def _parse(self, request) -> np.ndarray:
        texts = bk.input_array(request, embedding.TEXTS)
        if texts is None or texts.size == 0:
            raise bk.RequestError(f"{embedding.TEXTS} holds no texts: send a 1-D batch of texts")
        if texts.ndim != 1:
            raise bk.RequestError(
                f"{embedding.TEXTS} must be 1-D [N], got shape {list(texts.shape)}"
            )
        if len(texts) > embedding.MAX_TEXTS:
            raise bk.RequestError(
                f"{embedding.TEXTS} has {len(texts)} texts; "
                f"at most {embedding.MAX_TEXTS} fit in one request"
            )
        return texts

    @staticmethod
    def _run(items: list[np.ndarray]) -> list[dict]:
        return [{embedding.TEXT: texts.reshape(-1, 1)} for texts in items]

    def execute(self, requests):
        """One response per request, in order."""
        return bk.execute(requests, self._parse, self._run, model=self.name, rows=len)


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def text_cache_for(
    args: dict, params: dict[str, str], engine: engines.Engine
) -> text_cache.TextCache | None:
    """The per-text cache the config's ``text_cache_*`` parameters describe (None: off).

    ``text_cache_bytes`` sizes the in-process layer (0 turns the whole cache off); the shared
    layer is the Redis at ``$EMBED_TEXT_CACHE_URL``, if set, with ``text_cache_ttl_s``,
    ``text_cache_timeout_ms`` and the breaker's ``text_cache_breaker_failures`` and
    ``text_cache_breaker_reset_s``. The keyspace holds the file the encoder runs from (an
    engine differs from the graph it was built from) and how it runs it.
    """
    size = int(params.get("text_cache_bytes", "0"))
    if size <= 0:
        return None
    keyspace = text_cache.Keyspace(
        model=embedding.ENCODER,
        version=args["model_version"],
        encoder_sha256=_sha256(engine.source),
        tokenizer_sha256=hashlib.sha256(minilm_weights.read_member("tokenizer.json")).hexdigest(),
        max_tokens=embedding.MAX_TOKENS,
        runtime=engine.runtime,
    )
    shared = None
    url = os.environ.get(text_cache.URL_ENV)
    if url:
        settings = text_cache.SharedSettings.from_parameters(params)
        shared = text_cache.SharedLayer(url, **dataclasses.asdict(settings))
    return text_cache.TextCache(
        keyspace, embedding.HIDDEN_SIZE, text_cache.LocalLayer(size), shared
    )
