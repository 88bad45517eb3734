"""The text models' Python-backend adapters: tokenize, and tokenize_encode (text → embedding).

tokenize_encode exists for the CPU, where a second Python stub per request (tokenize, then an
encoder stub) costs more than the batch it forms: one execute tokenizes every text of every
request at once, sorts them by length into sub-batches of at most ``max_batch_tokens`` padded
positions (``pipelines.embedding.encode_sorted``) and runs the encoder's own ``model.onnx`` on
onnxruntime. Versions follow the encoder's: version N opens ``encoder/N/model.onnx``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines import embedding as spec
from pipelines import onnx_runner
from pipelines.backend import batching as bk
from pipelines.backend import metrics


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
        spec.tokenizer()
        self.metrics = metrics.TokenizeMetrics(args)

    def finalize(self):
        """Release the metric series before the stub exits."""
        self.metrics.close()

    def _parse(self, request) -> list[str]:
        try:
            return spec.decode_texts(bk.input_array(request, spec.TEXT))
        except spec.TextError as exc:
            self.metrics.failed([exc])
            raise bk.RequestError(str(exc)) from None

    def _run(self, items: list[list[str]]) -> list[dict]:
        tokens, truncated = spec.encode([t for texts in items for t in texts])
        outputs, start, padded = [], 0, 0
        for texts in items:
            # Each request padded to the bucket of its own longest text.
            mine = tokens[start : start + len(texts)]
            ids, mask = spec.pad(mine)
            start += len(texts)
            padded += ids.size
            outputs.append(
                {spec.INPUT_IDS: ids, spec.ATTENTION_MASK: mask, spec.TOKENS: token_counts(mine)}
            )
        self.metrics.batch(sum(map(len, tokens)), padded, truncated)
        return outputs

    def execute(self, requests):
        """One response per request, in order."""
        return bk.execute(requests, self._parse, self._run, model=self.name, rows=len)


class TokenizeEncodeModel(TokenizeModel):
    """tokenize_encode: texts → embeddings; a bad text fails only its own request."""

    def initialize(self, args):
        """Open the encoder's graph of this version, then load the tokenizer as tokenize does."""
        params = bk.parameters(args)
        repository = Path(args["model_repository"]).parent
        path = repository / spec.ENCODER / args["model_version"] / "model.onnx"
        self.session = onnx_runner.create_session(
            path,
            intra_op_threads=int(params.get("intra_op_thread_count", "1")),
            inter_op_threads=int(params.get("inter_op_thread_count", "1")),
        )
        self.max_tokens = int(params.get("max_batch_tokens", spec.MAX_BATCH_TOKENS))
        super().initialize(args)

    def _encoder(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = {spec.INPUT_IDS: ids, spec.ATTENTION_MASK: mask}
        return onnx_runner.run(self.session, feeds, [spec.EMBEDDING])[0]

    def _run(self, items: list[list[str]]) -> list[dict]:
        tokens, truncated = spec.encode([t for texts in items for t in texts])
        vectors, padded = spec.encode_sorted(self._encoder, tokens, self.max_tokens)
        self.metrics.batch(sum(map(len, tokens)), padded, truncated)
        sizes = [len(texts) for texts in items]
        parts = bk.split_rows(vectors, sizes, spec.EMBEDDING)
        counts = bk.split_rows(token_counts(tokens), sizes, spec.TOKENS)
        return [{spec.EMBEDDING: p, spec.TOKENS: c} for p, c in zip(parts, counts, strict=True)]

    def execute(self, requests):
        """Every text of every request in one tokenizer call and sorted encoder runs."""
        return bk.execute(requests, self._parse, self._run, model=self.name, rows=len, isolate=True)


class TextRowsModel:
    """texts_as_batch: a 1-D batch of texts [N] → embed's rows [N, 1], nothing else.

    The texts are checked where they are embedded; here only their count: none, or more than
    embed takes in one request (``spec.MAX_TEXTS``), is this request's error.
    """

    def initialize(self, args):
        """Keep the model's name for error messages."""
        self.name = args["model_name"]

    def _parse(self, request) -> np.ndarray:
        texts = bk.input_array(request, spec.TEXTS)
        if texts is None or texts.size == 0:
            raise bk.RequestError(f"{spec.TEXTS} holds no texts: send a 1-D batch of texts")
        if texts.ndim != 1:
            raise bk.RequestError(f"{spec.TEXTS} must be 1-D [N], got shape {list(texts.shape)}")
        if len(texts) > spec.MAX_TEXTS:
            raise bk.RequestError(
                f"{spec.TEXTS} has {len(texts)} texts; at most {spec.MAX_TEXTS} fit in one request"
            )
        return texts

    @staticmethod
    def _run(items: list[np.ndarray]) -> list[dict]:
        return [{spec.TEXT: texts.reshape(-1, 1)} for texts in items]

    def execute(self, requests):
        """One response per request, in order."""
        return bk.execute(requests, self._parse, self._run, model=self.name, rows=len)
