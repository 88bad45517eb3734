"""Triton adapter: logits → top-k ImageNet labels and probabilities."""

import numpy as np

from pipelines import classification as spec
from pipelines import triton_backend as tb


class TritonPythonModel:
    """Softmax and top-k once over all requests; each request keeps its own k."""

    def initialize(self, args):
        """Read the default k; load the label table before the first request."""
        self.default_k = int(tb.parameters(args).get("top_k", spec.DEFAULT_TOP_K))
        spec.label_names(np.zeros(1, dtype=np.int32))

    def _k(self, request):
        ks = tb.input_array(request, spec.TOP_K)
        if ks is None:
            return self.default_k
        ks = ks.reshape(-1)
        if len(ks) == 0 or np.any(ks != ks[0]):
            raise ValueError(f"{spec.TOP_K} must be one value for the whole request, got {ks}")
        k = int(ks[0])
        if not 1 <= k <= spec.NUM_CLASSES:
            raise ValueError(f"{spec.TOP_K} must be between 1 and {spec.NUM_CLASSES}, got {k}")
        return k

    def execute(self, requests):
        """One response per request, in order; a bad TOP_K fails only its request."""
        logits, ks = [], []
        for request in requests:
            try:
                ks.append(self._k(request))
                logits.append(tb.input_array(request, spec.LOGITS))
            except ValueError as exc:
                ks.append(exc)
        good = [k for k in ks if not isinstance(k, Exception)]
        if good:
            ids, scores = spec.top_k(np.concatenate(logits), max(good))
            id_parts = tb.split_rows(ids, [len(x) for x in logits])
            score_parts = tb.split_rows(scores, [len(x) for x in logits])
        responses, part = [], 0
        for k in ks:
            if isinstance(k, Exception):
                responses.append(tb.error(str(k)))
                continue
            # Rows are sorted, so the first k of the largest k are this request's top k.
            request_ids = id_parts[part][:, :k]
            responses.append(
                tb.respond(
                    {
                        spec.LABELS: spec.label_names(request_ids),
                        spec.SCORES: score_parts[part][:, :k],
                        spec.CLASS_IDS: request_ids,
                    }
                )
            )
            part += 1
        return responses
