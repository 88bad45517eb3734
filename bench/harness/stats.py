"""Triton's statistics API, as deltas over one measurement: formed batch sizes, queue, compute."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pipelines.backend import step_metrics


@dataclass(frozen=True)
class ModelDelta:
    """What one model did between two statistics snapshots."""

    model: str
    inferences: int
    executions: int
    batch_histogram: dict[int, int]  # formed batch size -> executions
    queue_ms: float  # per request, average
    compute_ms: float  # per request, average (input + infer + output)
    request_ms: float  # per request, average end-to-end inside the server
    cache_hits: int = 0  # requests answered from the response cache
    # formed batch size -> mean compute_infer of its executions, ms: are the slow sizes new ones?
    batch_infer_ms: dict[int, float] = field(default_factory=dict)

    @property
    def avg_batch(self) -> float:
        """Average formed batch size (inferences per execution)."""
        return self.inferences / self.executions if self.executions else 0.0


def merge_versions(versions: list[dict]) -> dict:
    """One model's statistics summed over its loaded versions (e.g. encoder fp32 and INT8)."""
    if len(versions) == 1:
        return versions[0]
    merged: dict = {"inference_count": 0, "execution_count": 0, "inference_stats": {}}
    batches: dict[int, int] = {}
    for v in versions:
        merged["inference_count"] += int(v.get("inference_count", 0))
        merged["execution_count"] += int(v.get("execution_count", 0))
        for key, entry in v.get("inference_stats", {}).items():
            total = merged["inference_stats"].setdefault(key, {"count": 0, "ns": 0})
            total["count"] += int(entry.get("count", 0))
            total["ns"] += int(entry.get("ns", 0))
        for b in v.get("batch_stats", []):
            total = batches.setdefault(int(b["batch_size"]), {"count": 0, "ns": 0})
            total["count"] += int(b["compute_infer"]["count"])
            total["ns"] += int(b["compute_infer"].get("ns", 0))
    merged["batch_stats"] = [
        {"batch_size": size, "compute_infer": infer} for size, infer in sorted(batches.items())
    ]
    return merged


def snapshot(client, models: Iterable[str], **options) -> dict[str, dict]:
    """Statistics per model (all versions together) from a tritonclient client.

    ``options`` go to ``get_inference_statistics``: a gRPC client needs ``as_json=True``.
    """
    return {
        model: merge_versions(client.get_inference_statistics(model, **options)["model_stats"])
        for model in models
    }


def _ns(stats: dict, key: str, field: str = "ns") -> int:
    return int(stats.get("inference_stats", {}).get(key, {}).get(field, 0))


def delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, ModelDelta]:
    """Per-model differences between two snapshots."""
    out = {}
    for model, end in after.items():
        start = before[model]
        success = _ns(end, "success", "count") - _ns(start, "success", "count")

        def per_request(key: str, end=end, start=start, success=success) -> float:
            return (_ns(end, key) - _ns(start, key)) / 1e6 / success if success else 0.0

        started = {
            int(b["batch_size"]): (
                int(b["compute_infer"]["count"]),
                int(b["compute_infer"].get("ns", 0)),
            )
            for b in start.get("batch_stats", [])
        }
        histogram, infer_ms = {}, {}
        for b in end.get("batch_stats", []):
            size = int(b["batch_size"])
            count0, ns0 = started.get(size, (0, 0))
            n = int(b["compute_infer"]["count"]) - count0
            if n:
                histogram[size] = n
                infer_ms[size] = (int(b["compute_infer"].get("ns", 0)) - ns0) / 1e6 / n
        out[model] = ModelDelta(
            model=model,
            inferences=int(end.get("inference_count", 0)) - int(start.get("inference_count", 0)),
            executions=int(end.get("execution_count", 0)) - int(start.get("execution_count", 0)),
            batch_histogram=histogram,
            queue_ms=per_request("queue"),
            compute_ms=sum(
                per_request(k) for k in ("compute_input", "compute_infer", "compute_output")
            ),
            request_ms=per_request("success"),
            cache_hits=_ns(end, "cache_hit", "count") - _ns(start, "cache_hit", "count"),
            batch_infer_ms=infer_ms,
        )
    return out


# One sample of Prometheus' text format: name{labels} value.
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} ([0-9.eE+-]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _series(page: str, model: str, version: str | None):
    """(name, labels, value) of every sample of ``model`` (of ``version`` only, if given)."""
    for line in page.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(2)))
        if labels.get("model") == model and version in (None, labels.get("version")):
            yield match.group(1), labels, float(match.group(3))


def token_counts(page: str, model: str, version: str | None = None) -> tuple[float, float]:
    """(real, padded) token positions a model counted, from a ``/metrics`` page.

    Sums ``pipeline_tokens_total`` and ``pipeline_padded_tokens_total`` over the series of
    ``model`` (of ``version`` only, if given); (0, 0) where the model has none yet.
    """
    totals = {step_metrics.TOKENS: 0.0, step_metrics.PADDED_TOKENS: 0.0}
    for name, _, value in _series(page, model, version):
        if name in totals:
            totals[name] += value
    return totals[step_metrics.TOKENS], totals[step_metrics.PADDED_TOKENS]


def text_cache_counts(page: str, model: str, version: str | None = None) -> dict[str, float]:
    """The per-text cache's texts so far: hits by layer (``local``, ``redis``) and ``misses``."""
    totals = {**dict.fromkeys(step_metrics.CACHE_LAYERS, 0.0), "misses": 0.0}
    for name, labels, value in _series(page, model, version):
        if name == step_metrics.TEXT_CACHE_HITS:
            totals[labels["layer"]] += value
        elif name == step_metrics.TEXT_CACHE_MISSES:
            totals["misses"] += value
    return totals
