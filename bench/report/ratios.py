"""The report's ratios: each metric and target computed from the rows of a run, per round."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bench.harness import variants
from bench.report.points import find, one
from pipelines import classification, embedding


class NotComputable(str):
    """Why a metric has no value in a round; the report prints ``n/a: <why>``, never a number."""


def best_under_p99(points: Iterable[dict], p99_ms: float) -> float:
    """Highest throughput among points whose p99 is within the budget (0 if none)."""
    return max((p["throughput"] for p in points if p["p99_ms"] <= p99_ms), default=0.0)


def equal_p99_ratio(ours: list[dict], theirs: list[dict]) -> float | NotComputable | None:
    """Our throughput ÷ theirs at the same p99 budget: the p99 of their best point.

    For each system the best throughput whose p99 does not exceed that budget. None where
    either side was not measured; ``NotComputable`` where none of our points kept within the
    budget (0 would claim we answer nothing at that latency, which no point measured says).
    """
    if not ours or not theirs:
        return None
    budget = max(theirs, key=lambda p: p["throughput"])["p99_ms"]
    theirs_best = best_under_p99(theirs, budget)
    ours_best = best_under_p99(ours, budget)
    if not ours_best:
        lowest = min(p["p99_ms"] for p in ours)
        return NotComputable(
            f"no point of ours within the peer's p99 of {budget:.1f} ms (our lowest p99 at the "
            f"levels measured: {lowest:.1f} ms)"
        )
    return ours_best / theirs_best if theirs_best else None


@dataclass(frozen=True)
class Metric:
    """A ratio (or time) computed within one round, with its target."""

    name: str
    compute: Callable[[list[dict], dict], float | None]
    target: float | None = None
    higher_is_better: bool = True
    unit: str = "x"
    note: str = ""
    # For peer comparisons: the payload whose load-generator headroom must be >= 2 for the
    # number to say anything about the servers (else the harness capped both).
    needs_headroom: tuple[str, str] | None = None  # (payload, model)

    def met(self, value: float) -> bool | None:
        """Whether the target is met (None where there is no target)."""
        if self.target is None:
            return None
        return value >= self.target if self.higher_is_better else value <= self.target


def _thr(rows, **match) -> float | None:
    row = one(rows, **match)
    return row["throughput"] if row else None


def ratio(a: float | None, b: float | None) -> float | None:
    """The ratio of a to b; None where either is missing (or b is zero)."""
    return a / b if a is not None and b else None


def _triton(
    model, protocol="grpc", variant="batching", payload="binary", level=None, dataset="samples"
):
    match = dict(
        system="triton",
        variant=variant,
        model=model,
        protocol=protocol,
        payload=payload,
        mode="concurrency",
        dataset=dataset,
        calls="sync",
    )
    if level is not None:
        match["level"] = float(level)
    return match


def _saturated(rows, **match) -> float | None:
    values = [r["throughput"] for r in find(rows, **match)]
    return max(values) if values else None


def _hop_end_to_end(rows, raw) -> float | None:
    row = one(rows, **_triton(classification.ENSEMBLE, level=1))
    pipeline = row and reference(row, raw, 1)
    if not pipeline:
        return None
    return (row["p50_ms"] - 1000.0 / pipeline) / len(variants.STEPS)


def reference(row: dict, raw: dict, batch: int | None = None) -> float | None:
    """The raw pipeline's images/s a row is compared with: at ``batch``, or at its best.

    Read beside the row itself where the harness did (``raw_reference``: just before and just
    after the case, on the same core), else the round's raw curve from minutes earlier.
    """
    beside = row.get("raw_reference")
    if beside:
        values = {int(k): v for k, v in json.loads(beside).items()}
    else:
        values = raw.get("pipeline", {})
    if not values:
        return None
    return values.get(batch) if batch is not None else max(values.values())


def _vs_raw_pipeline(
    model: str, protocol: str, level: int | None
) -> Callable[[list[dict], dict], float | None]:
    """Served images/s ÷ the raw pipeline's: at ``level`` vs batch 1, or at best vs best."""

    def compute(rows, raw) -> float | None:
        if level is not None:
            row = one(rows, **_triton(model, protocol, level=level))
            return row and ratio(row["throughput"], reference(row, raw, 1))
        ratios = [
            ratio(row["throughput"], reference(row, raw))
            for row in find(rows, **_triton(model, protocol))
        ]
        return max((r for r in ratios if r is not None), default=None)

    return compute


def _vs_pipeline_peer(model: str, level: int, field: str) -> Callable[[list[dict], dict], float]:
    """``model`` ÷ the FastAPI pipeline peer (JPEG → top-5), one field at one level, HTTP binary.

    Each side in units of the raw pipeline read beside it: images/s ÷ the raw images/s, p99 ×
    the raw images/s. The two run minutes apart, and the machine's speed with them.
    """

    def compute(rows, raw):
        ours = one(rows, **_triton(model, "http", level=level))
        theirs = one(
            rows, system="peer", model=classification.ENSEMBLE, payload="binary", level=float(level)
        )
        if not ours or not theirs:
            return None
        scales = [reference(row, raw) for row in (ours, theirs)]
        if None in scales:
            return ratio(ours[field], theirs[field])
        if field == "throughput":
            return ratio(ours[field] / scales[0], theirs[field] / scales[1])
        return ratio(ours[field] * scales[0], theirs[field] * scales[1])

    return compute


def _ensemble_vs_stages(combine: Callable[[list[float]], float]):
    """Ensemble throughput at c=16 ÷ ``combine`` of its three steps' own throughputs."""

    def compute(rows, raw) -> float | None:
        stages = [_thr(rows, **_triton(m, level=16)) for m in variants.STEPS]
        if any(not s for s in stages):
            return None
        return ratio(_thr(rows, **_triton(classification.ENSEMBLE, level=16)), combine(stages))

    return compute


_slowest_stage = _ensemble_vs_stages(min)


# Stages that share cores cannot beat one image's total cost over all of them.
_shared_core_bound = _ensemble_vs_stages(lambda stages: 1.0 / sum(1.0 / s for s in stages))


def _vs_peer_at_equal_p99(
    name: str,
    payload: str,
    model: str = classification.CLASSIFIER,
    *,
    dataset: str = "samples",
    peer_model: str | None = None,
    note: str = "",
) -> Metric:
    """Triton ÷ the FastAPI peer at equal p99, HTTP; target 2x, where the generator had headroom.

    The peer serves ``peer_model`` (default: ``model``) from the same ``payload``; the load
    generator must reach twice the fastest result on that payload and peer model.
    """

    def compute(rows, raw):
        ours = find(rows, **_triton(model, protocol="http", payload=payload, dataset=dataset))
        theirs = find(rows, system="peer", model=peer_model or model, payload=payload, calls="sync")
        return equal_p99_ratio(ours, theirs)

    return Metric(
        name, compute, target=2.0, note=note, needs_headroom=(payload, peer_model or model)
    )


def _vs_peer_at(
    model: str, level: int, field: str = "throughput"
) -> Callable[[list[dict], dict], float | None]:
    """Ours ÷ the embed peer's ``field`` at one concurrency, both HTTP JSON (same texts)."""

    def compute(rows, raw):
        ours = one(rows, **_triton(model, protocol="http", payload="json", level=level))
        theirs = one(
            rows, system="peer", model=embedding.ENSEMBLE, payload="json", level=level, calls="sync"
        )
        return ratio(ours and ours[field], theirs and theirs[field])

    return compute


# The same texts with asynchronous calls (perf_analyzer's OpenAI client has no other mode).
_JSON_ASYNC = dict(
    model=embedding.ENSEMBLE, protocol="http", payload="json", calls="async", dataset="samples"
)
EMBED_ASYNC = dict(system="triton", variant="batching", **_JSON_ASYNC)
PEER_ASYNC = dict(system="peer", **_JSON_ASYNC)


INFINITY = dict(system="infinity", model=embedding.ENSEMBLE, payload="openai", dataset="samples")


INFINITY_TARGET = 1.5  # embed ≥ 1.5x infinity-emb held to the same core


# Mixed-length texts (sentences and passages), every server with asynchronous calls.
MIXED = {
    name: {**match, "dataset": "mixed"}
    for name, match in (
        ("embed", EMBED_ASYNC),
        ("FastAPI peer", PEER_ASYNC),
        ("infinity-emb", INFINITY),
    )
}


def vs_infinity(
    ours: dict, level: int, field: str = "throughput"
) -> Callable[[list[dict], dict], float | None]:
    """``ours`` ÷ infinity-emb's ``field`` at one concurrency, both with asynchronous calls."""

    def compute(rows, raw):
        a = one(rows, **ours, mode="concurrency", level=float(level))
        b = one(rows, **INFINITY, mode="concurrency", level=float(level))
        return ratio(a and a[field], b and b[field])

    return compute


def _generator_headroom(
    payload: str, model: str = classification.CLASSIFIER
) -> Callable[[list[dict], dict], float | None]:
    """How far the load generator reached beyond the fastest result it is meant to measure.

    Its proven ceiling is the fastest answer it got for this payload from anything that does
    no work: the null peer, or Triton answering from its response cache.
    """

    def compute(rows, raw):
        measured = find(rows, payload=payload, protocol="http", model=model)
        ceiling = max(
            (
                r["throughput"]
                for r in measured
                if r["system"] == "null-peer" or r["dataset"] == "repeated"
            ),
            default=None,
        )
        fastest = max(
            (
                r["throughput"]
                for r in measured
                if r["system"] != "null-peer" and r["dataset"] != "repeated"
            ),
            default=None,
        )
        return ratio(ceiling, fastest)

    return compute


def _raw_best(kind: str) -> Callable[[dict], float | None]:
    return lambda raw: max(raw[kind].values()) if raw.get(kind) else None


def padding_ratio(row: dict | None) -> float | None:
    """Padded ÷ real token positions a row's server ran (None where it does not count them)."""
    if not row or row.get("tokens") in ("", None) or not row["tokens"]:
        return None
    return row["padded_tokens"] / row["tokens"]


def mixed_metric(server: str, level: int, field: str = "throughput", vs: str | None = None):
    """A mixed-length row's ``field`` (or padded ÷ real), or its ratio to server ``vs``'s."""

    def value(rows, name):
        row = one(rows, **MIXED[name], mode="concurrency", level=float(level))
        return padding_ratio(row) if field == "padding" else row and row[field]

    def compute(rows, raw):
        ours = value(rows, server)
        return ours if vs is None else ratio(ours, value(rows, vs))

    return compute


def _short_saturated(rows, raw) -> float | None:
    """Embed's best texts/s on short texts, any protocol ÷ the raw engine at its best batch."""
    served = _saturated(
        rows,
        system="triton",
        variant="batching",
        model=embedding.ENSEMBLE,
        dataset="samples",
        mode="concurrency",
    )
    return ratio(served, _raw_best("embed")(raw))


METRICS = [
    Metric(
        "raw model batching gain (best batch ÷ batch 1)",
        lambda rows, raw: ratio(max(raw["model"].values()), raw["model"][1]),
    ),
    Metric(
        "raw embed batching gain (best batch ÷ batch 1)",
        lambda rows, raw: ratio(_raw_best("embed")(raw), raw.get("embed", {}).get(1)),
    ),
    Metric(
        "served batching gain (classifier c=16: batching ÷ no-batching)",
        lambda rows, raw: ratio(
            _thr(rows, **_triton(classification.CLASSIFIER, level=16)),
            _thr(rows, **_triton(classification.CLASSIFIER, variant="no-batching", level=16)),
        ),
    ),
    Metric(
        "dynamic batching captures (classifier c=16 ÷ raw at its best batch)",
        lambda rows, raw: ratio(
            _thr(rows, **_triton(classification.CLASSIFIER, level=16)), max(raw["model"].values())
        ),
        target=0.9,
    ),
    *(
        metric
        for model in (classification.ENSEMBLE, classification.FUSED)
        for protocol in ("grpc", "http")
        for metric in (
            Metric(
                f"{model} served ÷ raw pipeline, saturation ({protocol})",
                _vs_raw_pipeline(model, protocol, None),
                target=0.95,
            ),
            Metric(
                f"{model} served ÷ raw pipeline, concurrency 1 ({protocol})",
                _vs_raw_pipeline(model, protocol, 1),
                target=0.85,
            ),
        )
    ),
    Metric(
        "classifier alone ÷ raw model, concurrency 1 (gRPC)",
        lambda rows, raw: ratio(
            _thr(rows, **_triton(classification.CLASSIFIER, level=1)), raw["model"][1]
        ),
    ),
    Metric("ensemble ÷ its slowest stage (c=16)", _slowest_stage, target=0.8),
    Metric(
        "ensemble ÷ shared-core bound 1/Σ(1/stage) (c=16)",
        _shared_core_bound,
        note="what the stages allow when they share the server's cores",
    ),
    Metric(
        "serving overhead per step, end to end (p50 c=1 − raw latency) ÷ 3",
        _hop_end_to_end,
        target=0.5,
        higher_is_better=False,
        unit=" ms",
    ),
    *(
        Metric(
            f"{model} ÷ FastAPI pipeline peer, {what} at concurrency {level} (HTTP binary)",
            _vs_pipeline_peer(model, level, field),
            target=target,
            higher_is_better=field == "throughput",
            note="the same JPEG bytes → top-5 behind FastAPI and a micro-batcher",
        )
        for model in (classification.ENSEMBLE, classification.FUSED)
        for level in (8, 32)
        for what, field, target in (("images/s", "throughput", 1.0), ("p99", "p99_ms", 1.1))
    ),
    _vs_peer_at_equal_p99(
        "Triton ÷ peer (FastAPI micro-batcher), same JSON payload, equal p99",
        "json",
        note="target applies where serving overhead matters; EfficientNet here is compute-bound",
    ),
    _vs_peer_at_equal_p99(
        "Triton ÷ peer, same binary-tensor payload, equal p99", "binary", note="as above"
    ),
    Metric(
        "embed served ÷ raw embed pipeline, saturation (gRPC, short texts)",
        lambda rows, raw: ratio(
            _saturated(rows, **_triton(embedding.ENSEMBLE)), _raw_best("embed")(raw)
        ),
    ),
    Metric(
        "embed served ÷ raw embed pipeline, concurrency 1 (gRPC)",
        lambda rows, raw: ratio(
            _thr(rows, **_triton(embedding.ENSEMBLE, level=1)), raw.get("embed", {}).get(1)
        ),
    ),
    Metric(
        "embed response-cache hits ÷ computed embeddings (HTTP JSON, c=16)",
        lambda rows, raw: ratio(
            _thr(
                rows,
                **_triton(embedding.ENSEMBLE, "http", payload="json", level=16, dataset="repeated"),
            ),
            _thr(rows, **_triton(embedding.ENSEMBLE, "http", payload="json", level=16)),
        ),
    ),
    Metric(
        "INT8 ÷ fp32 encoder, served embed (gRPC, c=16)",
        lambda rows, raw: ratio(
            _thr(rows, **_triton(embedding.INT8_ENSEMBLE, level=16)),
            _thr(rows, **_triton(embedding.ENSEMBLE, level=16)),
        ),
    ),
    Metric(
        "INT8 ÷ fp32 encoder, raw embed pipeline (best batch)",
        lambda rows, raw: ratio(_raw_best("embed_int8")(raw), _raw_best("embed")(raw)),
    ),
    _vs_peer_at_equal_p99(
        "Triton ÷ peer (embed, same JSON payload), equal p99", "json", embedding.ENSEMBLE
    ),
    _vs_peer_at_equal_p99(
        "Triton ÷ peer (embed_graph: one process, same JSON payload), equal p99",
        "json",
        embedding.GRAPH_ENSEMBLE,
        peer_model=embedding.ENSEMBLE,
    ),
    *(
        Metric(
            f"{model} ÷ peer texts/s at concurrency {level} (HTTP JSON)",
            _vs_peer_at(model, level),
            target=1.2 if level in (8, 32) else None,
        )
        for model in (embedding.ENSEMBLE, embedding.GRAPH_ENSEMBLE)
        for level in (1, 8, 32)
    ),
    *(
        Metric(
            f"{model} p99 ÷ peer p99 at concurrency {level} (HTTP JSON)",
            _vs_peer_at(model, level, "p99_ms"),
            target=1.0,
            higher_is_better=False,
        )
        for model in (embedding.ENSEMBLE, embedding.GRAPH_ENSEMBLE)
        for level in (1, 8, 32)
    ),
    Metric(
        "embed_graph served ÷ raw embed pipeline, saturation (gRPC, short texts)",
        lambda rows, raw: ratio(
            _saturated(rows, **_triton(embedding.GRAPH_ENSEMBLE)), _raw_best("embed")(raw)
        ),
        target=0.9,
    ),
    *(
        Metric(
            f"embed ÷ infinity-emb texts/s at concurrency {level} (async calls, same core)",
            vs_infinity(EMBED_ASYNC, level),
            target=INFINITY_TARGET,
            needs_headroom=("openai", embedding.ENSEMBLE),
        )
        for level in (1, 8, 32)
    ),
    *(
        Metric(
            f"embed p99 ÷ infinity-emb p99 at concurrency {level} (async calls)",
            vs_infinity(EMBED_ASYNC, level, "p99_ms"),
            higher_is_better=False,
        )
        for level in (1, 8, 32)
    ),
    *(
        Metric(
            f"FastAPI peer ÷ infinity-emb texts/s at concurrency {level} (async calls)",
            vs_infinity(PEER_ASYNC, level),
        )
        for level in (1, 8, 32)
    ),
    Metric(
        "load generator headroom, OpenAI /embeddings (null server ÷ infinity-emb's best)",
        _generator_headroom("openai", embedding.ENSEMBLE),
        target=2.0,
        note="as above",
    ),
    _vs_peer_at_equal_p99(
        "Triton cache hits ÷ peer (embed, same JSON payload), equal p99",
        "json",
        embedding.ENSEMBLE,
        dataset="repeated",
        note="repeated queries; the peer has no cache, as a plain FastAPI service",
    ),
    Metric(
        "load generator headroom, embed JSON (null model or cache hits ÷ fastest computed)",
        _generator_headroom("json", embedding.ENSEMBLE),
        target=2.0,
        note="as above",
    ),
    Metric(
        "load generator headroom, JSON (null model ÷ fastest JSON result)",
        _generator_headroom("json"),
        target=2.0,
        note="≥ 2 means no result was capped by the harness",
    ),
    Metric(
        "load generator headroom, binary HTTP (null model ÷ fastest binary HTTP result)",
        _generator_headroom("binary"),
        target=2.0,
        note="as above",
    ),
]


def _vs_peer_async(level: int, field: str = "throughput") -> Callable[[list[dict], dict], float]:
    """Ratio of embed to the FastAPI peer at one concurrency, both with asynchronous calls.

    The mode every server of the targets is measured in (infinity-emb's client has no other),
    at every level the targets name.
    """

    def compute(rows, raw):
        ours, theirs = one(rows, **EMBED_ASYNC, level=level), one(rows, **PEER_ASYNC, level=level)
        return ratio(ours and ours[field], theirs and theirs[field])

    return compute


# The embedding service's targets, each a ratio within one round (docs/performance.md).
TARGETS = [
    *(
        Metric(
            f"short texts, c={level}: embed ÷ FastAPI batcher, texts/s",
            _vs_peer_async(level),
            target=1.0,
            needs_headroom=("json", embedding.ENSEMBLE),
        )
        for level in (8, 32)
    ),
    *(
        Metric(
            f"short texts, c={level}: embed p99 ÷ FastAPI batcher p99",
            _vs_peer_async(level, "p99_ms"),
            target=1.1,
            higher_is_better=False,
        )
        for level in (8, 32, 1)
    ),
    Metric(
        "short texts, saturation: embed ÷ raw engine at its best batch (padded to the longest)",
        _short_saturated,
        target=0.95,
    ),
    *(
        Metric(
            f"mixed lengths, c={level}: embed ÷ {other}, texts/s",
            mixed_metric("embed", level, vs=other),
            target=2.0,
        )
        for level in (8, 32)
        for other in ("FastAPI peer", "infinity-emb")
    ),
    *(
        Metric(
            f"mixed lengths, c={level}: embed p99 ÷ {other} p99",
            mixed_metric("embed", level, "p99_ms", vs=other),
            target=1.0,
            higher_is_better=False,
        )
        for level in (8, 32)
        for other in ("FastAPI peer", "infinity-emb")
    ),
    *(
        Metric(
            f"mixed lengths, c={level}: embed padded ÷ real tokens",
            mixed_metric("embed", level, "padding"),
            target=1.2,
            higher_is_better=False,
        )
        for level in (8, 32)
    ),
]


def summarize(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def metric_table(
    rows: list[dict], raw: dict[int, dict], metrics: list[Metric] | None = None
) -> list[dict]:
    """Each metric (default: METRICS) per round, then its median and spread over rounds."""
    table = []
    # Runs without the raw engine (``--only embed-peers``) have rounds with rows and no curves.
    rounds = {n: raw.get(n, {}) for n in sorted(set(raw) | {r["round"] for r in rows})}
    for metric in METRICS if metrics is None else metrics:
        values, why = [], []
        for round_, curves in rounds.items():
            try:
                value = metric.compute([r for r in rows if r["round"] == round_], curves)
            except KeyError:  # a raw curve this run did not measure
                value = None
            if isinstance(value, NotComputable):
                why.append(f"round {round_}: {value}")
            elif value is not None:
                values.append(value)
        if not values:
            table.append({"metric": metric, "values": [], "why": "; ".join(why)})
            continue
        median, low, high = summarize(values)
        entry = {
            "metric": metric,
            "values": values,
            "median": median,
            "low": low,
            "high": high,
            "met": metric.met(median),
        }
        if metric.needs_headroom:
            headroom = [
                _generator_headroom(*metric.needs_headroom)([r for r in rows if r["round"] == n], c)
                for n, c in rounds.items()
            ]
            if any(h is not None and h < 2 for h in headroom):
                # The load generator, not either server, set these numbers.
                entry.update(met=None, capped=True)
        table.append(entry)
    return table
