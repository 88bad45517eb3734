"""Triton adapter: logits → top-k ImageNet labels and probabilities."""

import numpy as np

from pipelines import classification as spec
from pipelines.backend import batching as bk


class TritonPythonModel:
    """Softmax and top-k once over all requests; each request keeps its own k."""

    def initialize(self, args):
        """Read the default k; load the label table before the first request."""
        self.name = args["model_name"]
        self.default_k = int(bk.parameters(args).get("top_k", spec.DEFAULT_TOP_K))
        spec.label_names(np.zeros(1, dtype=np.int32))

    def _k(self, request) -> int:
        ks = bk.input_array(request, spec.TOP_K)
        if ks is None:
            return self.default_k
        ks = ks.reshape(-1)
        if len(ks) == 0 or np.any(ks != ks[0]):
            raise bk.RequestError(f"{spec.TOP_K} must be one value for the whole request, got {ks}")
        k = int(ks[0])
        if not 1 <= k <= spec.NUM_CLASSES:
            raise bk.RequestError(f"{spec.TOP_K} must be between 1 and {spec.NUM_CLASSES}, got {k}")
        return k

    def _parse(self, request) -> tuple[np.ndarray, int]:
        k = self._k(request)
        return bk.inputs(request, [spec.LOGITS])[spec.LOGITS], k

    def _run(self, items: list[tuple[np.ndarray, int]]) -> list[dict]:
        logits = [x for x, _ in items]
        ids, scores = spec.top_k(np.concatenate(logits), max(k for _, k in items))
        sizes = [len(x) for x in logits]
        outputs = []
        for (_, k), part_ids, part_scores in zip(
            items,
            bk.split_rows(ids, sizes, spec.CLASS_IDS),
            bk.split_rows(scores, sizes, spec.SCORES),
            strict=True,
        ):
            # Rows are sorted, so the first k of the largest k are this request's top k.
            request_ids = part_ids[:, :k]
            outputs.append(
                {
                    spec.LABELS: spec.label_names(request_ids),
                    spec.SCORES: part_scores[:, :k],
                    spec.CLASS_IDS: request_ids,
                }
            )
        return outputs

    def execute(self, requests):
        """One response per request, in order; a bad TOP_K fails only its request."""
        return bk.execute(
            requests, self._parse, self._run, model=self.name, rows=lambda item: len(item[0])
        )
