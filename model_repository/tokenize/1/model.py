"""Triton adapter: UTF-8 texts → word-piece ids and attention masks (pipelines.embedding)."""

from pipelines import embedding as spec
from pipelines.backend import batching as bk
from pipelines.backend import metrics


class TritonPythonModel:
    """Tokenizes every text of every request in one batch call; a bad text fails its request."""

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
            ids, mask = spec.pad(tokens[start : start + len(texts)])
            start += len(texts)
            padded += ids.size
            outputs.append({spec.INPUT_IDS: ids, spec.ATTENTION_MASK: mask})
        self.metrics.batch(sum(map(len, tokens)), padded, truncated)
        return outputs

    def execute(self, requests):
        """One response per request, in order."""
        return bk.execute(requests, self._parse, self._run, model=self.name, rows=len)
