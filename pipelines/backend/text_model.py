"""The text models' Python-backend adapters: tokenize, and tokenize_encode (text → embedding).

tokenize_encode exists for the CPU, where a second Python stub per request (tokenize, then an
encoder stub) costs more than the batch it forms: one execute tokenizes every text of every
request at once, sorts them by length into sub-batches of at most ``max_batch_tokens`` padded
positions (``pipelines.padding.encode_sorted``) and runs the encoder's own ``model.onnx`` on
onnxruntime. Versions follow the encoder's: version N opens ``encoder/N/model.onnx``.

Where Triton serves the encoder on a native backend (TensorRT or onnxruntime, in the NGC
container: ``encoder_backend: "triton"``), the step calls that model through BLS instead of
running the graph itself, one request per sub-batch. On a GPU host whose server has neither
backend (``configs/gpu-local.pbtxt``: ``encoder_backend: "torch"``) it runs the network in
PyTorch on its instance's GPU. ``pipelines.backend.engines`` opens each of them. The
``tokenizer`` parameter may name a copy of the package's tokenizer.json (sha256 checked), and
``run_cost_tokens`` what one more encoder run costs (``padding.sub_batches``).

In front of the encoder it keeps a per-text cache (``pipelines.text_cache``): its own LRU of
``text_cache_bytes``, and the Redis at ``$EMBED_TEXT_CACHE_URL`` when the launcher gives one.
Only texts neither layer has are tokenized and encoded, once each however often they repeat in
the batch; the answer is the same vectors as without the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from pipelines import embedding, padding, text_cache, tokenization
from pipelines.backend import batching, engines, step_metrics, step_traces, torch_io


def token_counts(tokens: list[list[int]]) -> np.ndarray:
    """TOKENS of each text, [n, 1] int32: what OpenAI's ``usage.prompt_tokens`` adds up."""
    return np.array([[len(t)] for t in tokens], dtype=np.int32).reshape(-1, 1)


def must_refuse(length: int, cut: bool) -> bool:
    """Whether a text of ``length`` word pieces is refused: over the limit, and not to be cut."""
    return length > embedding.MAX_TOKENS and not cut


@dataclasses.dataclass
class Texts:
    """One request's texts and, for each, whether it may be cut at ``MAX_TOKENS``."""

    texts: list[str]
    truncate: list[bool]

    def __len__(self) -> int:
        return len(self.texts)

    def refusal(self, lengths: list[int]) -> tokenization.TextError | None:
        """The error for its first text over the limit that may not be cut, if any."""
        for i, (length, cut) in enumerate(zip(lengths, self.truncate, strict=True)):
            if must_refuse(length, cut):
                return tokenization.too_long(i, length)
        return None


def read_texts(request) -> Texts:
    """A request's TEXT items and TRUNCATE flags (false where absent).

    Raises:
        tokenization.TextError: a text that is not one, or flags that are not one per text.
    """
    texts = tokenization.decode_texts(batching.input_array(request, embedding.TEXT))
    flags = batching.input_array(request, embedding.TRUNCATE)
    if flags is None:
        return Texts(texts, [False] * len(texts))
    if flags.size != len(texts):
        raise tokenization.TextError(
            f"{embedding.TRUNCATE} has {flags.size} flags for {len(texts)} texts: one per text"
        )
    return Texts(texts, [bool(f) for f in flags.reshape(-1)])


# One text's answer: (vector, word pieces), or its word pieces alone where it is refused.
Answer = tuple[np.ndarray, int] | int


class TokenizeModel:
    """tokenize: UTF-8 texts → word-piece ids and masks, each request padded to its own bucket.

    Every text of every request goes through one tokenizer call; a bad text fails only its
    own request.
    """

    def initialize(self, args):
        """Load the tokenizer before the first request; create this instance's metrics."""
        self.name = args["model_name"]
        self.tokenizer = tokenization.tokenizer(*tokenizer_file(args, batching.parameters(args)))
        self.metrics = step_metrics.TokenizeMetrics(args)

    def finalize(self):
        """Release the metric series before the stub exits."""
        self.metrics.close()

    def _parse(self, request) -> Texts:
        try:
            return read_texts(request)
        except tokenization.TextError as exc:
            self.metrics.failed([exc])
            raise batching.RequestError(str(exc)) from None

    def _run(self, items: list[Texts]) -> list[dict | Exception]:
        texts = [t for r in items for t in r.texts]
        with step_traces.phase("tokenize", texts=len(texts)):
            tokens, lengths = tokenization.encode_counted(texts, self.tokenizer)
        outputs, refused, start, real, padded, truncated = [], [], 0, 0, 0, 0
        for request in items:
            mine = slice(start, start + len(request))
            start += len(request)
            error = request.refusal(lengths[mine])
            if error is not None:
                refused.append(error)
                outputs.append(batching.RequestError(str(error)))
                continue
            # Each request padded to the bucket of its own longest text.
            ids, mask = padding.pad(tokens[mine])
            real += sum(map(len, tokens[mine]))
            padded += ids.size
            truncated += sum(n > embedding.MAX_TOKENS for n in lengths[mine])
            outputs.append(
                {
                    embedding.INPUT_IDS: ids,
                    embedding.ATTENTION_MASK: mask,
                    embedding.TOKENS: token_counts(tokens[mine]),
                }
            )
        self.metrics.failed(refused)
        self.metrics.batch(real, padded, truncated)
        return outputs

    def execute(self, requests):
        """One response per request, in order."""
        return batching.execute(requests, self._parse, self._run, model=self.name, rows=len)


class TokenizeEncodeModel(TokenizeModel):
    """tokenize_encode: texts → embeddings; a bad text fails only its own request."""

    def initialize(self, args):
        """Open the encoder of this version (its graph, or Triton's model), then the tokenizer."""
        params = batching.parameters(args)
        version = args["model_version"]
        # Another text service's encoder (python -m export sentence) is named by a parameter.
        encoder = params.get("encoder", embedding.ENCODER)
        graph = Path(args["model_repository"]).parent / encoder / version / "model.onnx"
        max_rows = int(params.get("encoder_max_batch", str(embedding.MAX_TEXTS)))
        runtime = params.get("encoder_backend", "onnxruntime")
        self.engine = engines.open_engine(
            graph,
            [embedding.EMBEDDING],
            params,
            runtime=runtime,
            served=engines.Served(encoder, int(version), max_rows),
            device=torch_io.instance_device(args) if runtime == "torch" else "cpu",
            max_rows=json.loads(args["model_config"])["max_batch_size"],
        )
        self.max_tokens = int(params.get("max_batch_tokens", padding.MAX_BATCH_TOKENS))
        self.run_cost = int(params.get("run_cost_tokens", padding.RUN_COST_TOKENS))
        super().initialize(args)
        self.cache = text_cache_for(args, params, self.engine)
        self.cache_metrics = step_metrics.TextCacheMetrics(args) if self.cache else None

    def finalize(self):
        """Release the metric series before the stub exits."""
        if self.cache_metrics is not None:
            self.cache_metrics.close()
        super().finalize()

    def _encode(self, texts: list[str], truncate: list[bool]) -> list[Answer]:
        """Each text's (vector, word pieces) through the encoder, or its length if refused."""
        with step_traces.phase("tokenize", texts=len(texts)):
            tokens, lengths = tokenization.encode_counted(texts, self.tokenizer)
        kept = [i for i, cut in enumerate(truncate) if not must_refuse(lengths[i], cut)]
        answers: list[Answer] = list(lengths)  # a refused text's answer: its length
        if kept:
            with step_traces.phase("encode", texts=len(kept)):
                vectors, padded = padding.encode_sorted(
                    self._encoder, [tokens[i] for i in kept], self.max_tokens, self.run_cost
                )
            for i, vector in zip(kept, vectors, strict=True):
                answers[i] = (vector, len(tokens[i]))
            real = sum(len(tokens[i]) for i in kept)
            cut = sum(lengths[i] > embedding.MAX_TOKENS for i in kept)
            self.metrics.batch(real, padded, cut)
        return answers

    def _encoder(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Embeddings [n, 384] of padded rows, in their order."""
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        return self.engine(feeds)[0]

    def _embed(self, texts: list[str], truncate: list[bool]) -> list[Answer]:
        """Every text's answer: from the cache where it has one, else from the encoder.

        The cache keys each text with its flag: a cut vector never answers a text that may not
        be cut, and a refused text is never stored.
        """
        if self.cache is None:
            return self._encode(texts, truncate)
        keyed = list(zip(texts, truncate, strict=True))
        with step_traces.phase("cache lookup", texts=len(texts)):
            found, looked = self.cache.lookup(texts, truncate)
        # Each (text, flag) still missing is encoded once, however often it repeats.
        todo = list(dict.fromkeys(k for k, hit in zip(keyed, found, strict=True) if hit is None))
        outcomes = [looked]
        if todo:
            answers = self._encode([t for t, _ in todo], [f for _, f in todo])
            new = dict(zip(todo, answers, strict=True))
            kept = [(key, a) for key, a in new.items() if not isinstance(a, int)]
            if kept:
                with step_traces.phase("cache store", texts=len(kept)):
                    stored = self.cache.store(
                        [text for (text, _), _ in kept],
                        [vector for _, (vector, _) in kept],
                        [n for _, (_, n) in kept],
                        [flag for (_, flag), _ in kept],
                    )
                outcomes.append(stored)
            found = [new[k] if hit is None else hit for k, hit in zip(keyed, found, strict=True)]
        shared = self.cache.shared
        self.cache_metrics.record(outcomes, shared.open if shared is not None else None)
        return found

    def _run(self, items: list[Texts]) -> list[dict | Exception]:
        answers = self._embed(
            [t for r in items for t in r.texts], [f for r in items for f in r.truncate]
        )
        outputs, refused, start = [], [], 0
        for request in items:
            mine = answers[start : start + len(request)]
            start += len(request)
            lengths = [a if isinstance(a, int) else 0 for a in mine]
            error = request.refusal(lengths)
            if error is not None:
                refused.append(error)
                outputs.append(batching.RequestError(str(error)))
                continue
            outputs.append(
                {
                    embedding.EMBEDDING: np.stack([vector for vector, _ in mine]),
                    embedding.TOKENS: np.array([[n] for _, n in mine], dtype=np.int32),
                }
            )
        self.metrics.failed(refused)
        return outputs

    def execute(self, requests):
        """Every text of every request in one tokenizer call and sorted encoder runs."""
        return batching.execute(
            requests, self._parse, self._run, model=self.name, rows=len, isolate=True
        )


class TextRowsModel:
    """texts_as_batch: a 1-D batch of texts [N] → embed's rows [N, 1], nothing else.

    The texts are checked where they are embedded; here only their count: none, or more than
    embed takes in one request (``embedding.MAX_TEXTS``), is this request's error. The request's
    one TRUNCATE flag (false when absent) goes with every row.
    """

    def initialize(self, args):
        """Keep the model's name for error messages."""
        self.name = args["model_name"]

    def _parse(self, request) -> tuple[np.ndarray, bool]:
        texts = batching.input_array(request, embedding.TEXTS)
        if texts is None or texts.size == 0:
            raise batching.RequestError(
                f"{embedding.TEXTS} holds no texts: send a 1-D batch of texts"
            )
        if texts.ndim != 1:
            raise batching.RequestError(
                f"{embedding.TEXTS} must be 1-D [N], got shape {list(texts.shape)}"
            )
        if len(texts) > embedding.MAX_TEXTS:
            raise batching.RequestError(
                f"{embedding.TEXTS} has {len(texts)} texts; "
                f"at most {embedding.MAX_TEXTS} fit in one request"
            )
        flag = batching.input_array(request, embedding.TRUNCATE)
        if flag is not None and flag.size != 1:
            raise batching.RequestError(
                f"{embedding.TRUNCATE} is one flag for all the texts, got shape {list(flag.shape)}"
            )
        return texts, flag is not None and bool(flag.reshape(-1)[0])

    @staticmethod
    def _run(items: list[tuple[np.ndarray, bool]]) -> list[dict]:
        return [
            {
                embedding.TEXT: texts.reshape(-1, 1),
                embedding.TRUNCATE: np.full((len(texts), 1), cut, dtype=bool),
            }
            for texts, cut in items
        ]

    def execute(self, requests):
        """One response per request, in order."""
        return batching.execute(
            requests, self._parse, self._run, model=self.name, rows=lambda item: len(item[0])
        )


def tokenizer_file(args: dict, params: dict[str, str]) -> tuple[str | None, str | None]:
    """The ``tokenizer`` parameter's file (relative to the model's folder) and its sha256.

    No parameter: the MiniLM package's tokenizer. ``tokenizer_sha256`` pins another model's
    file; without it the file must be a copy of the package's.
    """
    path = params.get("tokenizer")
    if path is not None:
        path = str(Path(args["model_repository"]) / path)  # an absolute path stays as it is
    return path, params.get("tokenizer_sha256")


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
    engine differs from the graph it was built from, a compact copy from the weights), how it
    runs it (FP16 differs from fp32) and the tokenizer file the step reads.
    """
    size = int(params.get("text_cache_bytes", "0"))
    if size <= 0:
        return None
    keyspace = text_cache.Keyspace(
        model=params.get("encoder", embedding.ENCODER),
        version=args["model_version"],
        encoder_sha256=_sha256(engine.source),
        tokenizer_sha256=hashlib.sha256(
            tokenization.tokenizer_json(*tokenizer_file(args, params))
        ).hexdigest(),
        max_tokens=embedding.MAX_TOKENS,
        runtime=engine.numerics,
    )
    shared = None
    url = os.environ.get(text_cache.URL_ENV)
    if url:
        settings = text_cache.SharedSettings.from_parameters(params)
        shared = text_cache.SharedLayer(url, **dataclasses.asdict(settings))
    outputs = json.loads(args["model_config"])["output"]
    (width,) = next(o["dims"] for o in outputs if o["name"] == embedding.EMBEDDING)
    return text_cache.TextCache(keyspace, int(width), text_cache.LocalLayer(size), shared)
