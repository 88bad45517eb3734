"""Triton adapter: UTF-8 texts → word-piece ids and attention masks (pipelines.embedding)."""

from pipelines import embedding as spec
from pipelines import triton_backend as tb


class TritonPythonModel:
    """Tokenizes every text of every request in one batch call; a bad text fails its request."""

    def initialize(self, args):
        """Load the tokenizer before the first request."""
        spec.tokenizer()

    def _texts(self, request) -> list[str]:
        items = tb.input_array(request, spec.TEXT).reshape(-1)
        if len(items) == 0:
            raise spec.TextError("no texts in the request")
        texts = []
        for i, item in enumerate(items):
            try:
                texts.append(spec.decode_text(item))
            except spec.TextError as exc:
                raise spec.TextError(f"{spec.TEXT}[{i}]: {exc}") from None
        return texts

    def execute(self, requests):
        """One response per request, each padded to the bucket of its own longest text."""
        per_request: list[list[str] | object] = []
        for request in requests:
            if request.is_cancelled():
                per_request.append(tb.cancelled())
                continue
            try:
                per_request.append(self._texts(request))
            except spec.TextError as exc:
                per_request.append(tb.error(str(exc)))
        flat = [t for texts in per_request if isinstance(texts, list) for t in texts]
        tokens, _ = spec.encode(flat) if flat else ([], 0)
        responses, start = [], 0
        for texts in per_request:
            if not isinstance(texts, list):
                responses.append(texts)  # the error response made above
                continue
            ids, mask = spec.pad(tokens[start : start + len(texts)])
            start += len(texts)
            responses.append(tb.respond({spec.INPUT_IDS: ids, spec.ATTENTION_MASK: mask}))
        return responses
