"""Ratios, the markdown report and the plots, computed from points.csv and raw.csv.

Pure functions over recorded rows, so that a report can be rebuilt (and tested) without a server.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pipelines import classification as spec
from pipelines import embedding

ENS, CLS, PRE, POST = spec.ENSEMBLE, spec.CLASSIFIER, spec.PREPROCESS, spec.POSTPROCESS
FUSED = spec.FUSED
EMB, EMB8, GRAPH = embedding.ENSEMBLE, "embed_int8", embedding.GRAPH_ENSEMBLE
STEPS = 3


TEXT_FIELDS = {
    "system",
    "variant",
    "model",
    "protocol",
    "payload",
    "mode",
    "dataset",
    "calls",
    "error",
    "classifier_batch_histogram",
    "cpu_ms_per_item",
    "raw_stage_ms",
    "raw_reference",
}
CASE_FIELDS = (
    "system",
    "variant",
    "model",
    "dataset",
    "protocol",
    "payload",
    "calls",
    "mode",
    "level",
)


def load(points_csv: Path, raw_csv: Path) -> tuple[list[dict], dict[int, dict]]:
    """Rows of points.csv (numbers parsed) and raw curves per round."""
    rows = []
    with open(points_csv, newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key not in TEXT_FIELDS and value != "":
                    row[key] = float(value)
            row["round"] = int(row["round"])
            row.setdefault("dataset", "samples")  # reports written before the field existed
            row.setdefault("calls", "sync")  # likewise
            rows.append(row)
    raw: dict[int, dict] = defaultdict(lambda: defaultdict(dict))
    with open(raw_csv, newline="") as f:
        for row in csv.DictReader(f):
            raw[int(row["round"])][row["kind"]][int(row["batch_size"])] = float(row["throughput"])
    return rows, {r: dict(curves) for r, curves in raw.items()}


def find(rows: Iterable[dict], **match) -> list[dict]:
    """Rows whose fields equal every given value and that measured something."""
    return [
        r
        for r in rows
        if r.get("throughput") not in ("", None) and all(r.get(k) == v for k, v in match.items())
    ]


def one(rows: Iterable[dict], **match) -> dict | None:
    """The single matching row (None if absent)."""
    found = find(rows, **match)
    return found[0] if found else None


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


def _ratio(a: float | None, b: float | None) -> float | None:
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
    row = one(rows, **_triton(ENS, level=1))
    pipeline = row and reference(row, raw, 1)
    if not pipeline:
        return None
    return (row["p50_ms"] - 1000.0 / pipeline) / STEPS


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
            return row and _ratio(row["throughput"], reference(row, raw, 1))
        ratios = [
            _ratio(row["throughput"], reference(row, raw))
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
        theirs = one(rows, system="peer", model=ENS, payload="binary", level=float(level))
        if not ours or not theirs:
            return None
        scales = [reference(row, raw) for row in (ours, theirs)]
        if None in scales:
            return _ratio(ours[field], theirs[field])
        if field == "throughput":
            return _ratio(ours[field] / scales[0], theirs[field] / scales[1])
        return _ratio(ours[field] * scales[0], theirs[field] * scales[1])

    return compute


def _ensemble_vs_stages(combine: Callable[[list[float]], float]):
    """Ensemble throughput at c=16 ÷ ``combine`` of its three steps' own throughputs."""

    def compute(rows, raw) -> float | None:
        stages = [_thr(rows, **_triton(m, level=16)) for m in (PRE, CLS, POST)]
        if any(not s for s in stages):
            return None
        return _ratio(_thr(rows, **_triton(ENS, level=16)), combine(stages))

    return compute


_slowest_stage = _ensemble_vs_stages(min)
# Stages that share cores cannot beat one image's total cost over all of them.
_shared_core_bound = _ensemble_vs_stages(lambda stages: 1.0 / sum(1.0 / s for s in stages))


def _peer_ratio(
    payload: str, model: str = CLS, dataset: str = "samples", peer_model: str | None = None
) -> Callable[[list[dict], dict], float | None]:
    def compute(rows, raw):
        ours = find(rows, **_triton(model, protocol="http", payload=payload, dataset=dataset))
        theirs = find(rows, system="peer", model=peer_model or model, payload=payload, calls="sync")
        return equal_p99_ratio(ours, theirs)

    return compute


def _vs_peer_at(
    model: str, level: int, field: str = "throughput"
) -> Callable[[list[dict], dict], float | None]:
    """Ours ÷ the embed peer's ``field`` at one concurrency, both HTTP JSON (same texts)."""

    def compute(rows, raw):
        ours = one(rows, **_triton(model, protocol="http", payload="json", level=level))
        theirs = one(rows, system="peer", model=EMB, payload="json", level=level, calls="sync")
        return _ratio(ours and ours[field], theirs and theirs[field])

    return compute


# The same texts with asynchronous calls (perf_analyzer's OpenAI client has no other mode).
EMBED_ASYNC = dict(
    system="triton",
    variant="batching",
    model=EMB,
    protocol="http",
    payload="json",
    calls="async",
    dataset="samples",
)
PEER_ASYNC = dict(
    system="peer", model=EMB, protocol="http", payload="json", calls="async", dataset="samples"
)
INFINITY = dict(system="infinity", model=EMB, payload="openai", dataset="samples")
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


def _vs_infinity(
    ours: dict, level: int, field: str = "throughput"
) -> Callable[[list[dict], dict], float | None]:
    """``ours`` ÷ infinity-emb's ``field`` at one concurrency, both with asynchronous calls."""

    def compute(rows, raw):
        a = one(rows, **ours, mode="concurrency", level=float(level))
        b = one(rows, **INFINITY, mode="concurrency", level=float(level))
        return _ratio(a and a[field], b and b[field])

    return compute


def _generator_headroom(
    payload: str, model: str = CLS
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
        return _ratio(ceiling, fastest)

    return compute


def _raw_best(kind: str) -> Callable[[dict], float | None]:
    return lambda raw: max(raw[kind].values()) if raw.get(kind) else None


def padding_ratio(row: dict | None) -> float | None:
    """Padded ÷ real token positions a row's server ran (None where it does not count them)."""
    if not row or row.get("tokens") in ("", None) or not row["tokens"]:
        return None
    return row["padded_tokens"] / row["tokens"]


def _mixed(server: str, level: int, field: str = "throughput", vs: str | None = None):
    """A mixed-length row's ``field`` (or padded ÷ real), or its ratio to server ``vs``'s."""

    def value(rows, name):
        row = one(rows, **MIXED[name], mode="concurrency", level=float(level))
        return padding_ratio(row) if field == "padding" else row and row[field]

    def compute(rows, raw):
        ours = value(rows, server)
        return ours if vs is None else _ratio(ours, value(rows, vs))

    return compute


def _short_saturated(rows, raw) -> float | None:
    """Embed's best texts/s on short texts, any protocol ÷ the raw engine at its best batch."""
    served = _saturated(
        rows, system="triton", variant="batching", model=EMB, dataset="samples", mode="concurrency"
    )
    return _ratio(served, _raw_best("embed")(raw))


METRICS = [
    Metric(
        "raw model batching gain (best batch ÷ batch 1)",
        lambda rows, raw: _ratio(max(raw["model"].values()), raw["model"][1]),
    ),
    Metric(
        "raw embed batching gain (best batch ÷ batch 1)",
        lambda rows, raw: _ratio(_raw_best("embed")(raw), raw.get("embed", {}).get(1)),
    ),
    Metric(
        "served batching gain (classifier c=16: batching ÷ no-batching)",
        lambda rows, raw: _ratio(
            _thr(rows, **_triton(CLS, level=16)),
            _thr(rows, **_triton(CLS, variant="no-batching", level=16)),
        ),
    ),
    Metric(
        "dynamic batching captures (classifier c=16 ÷ raw at its best batch)",
        lambda rows, raw: _ratio(_thr(rows, **_triton(CLS, level=16)), max(raw["model"].values())),
        target=0.9,
    ),
    *(
        metric
        for model in (ENS, FUSED)
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
        lambda rows, raw: _ratio(_thr(rows, **_triton(CLS, level=1)), raw["model"][1]),
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
        for model in (ENS, FUSED)
        for level in (8, 32)
        for what, field, target in (("images/s", "throughput", 1.0), ("p99", "p99_ms", 1.1))
    ),
    Metric(
        "Triton ÷ peer (FastAPI micro-batcher), same JSON payload, equal p99",
        _peer_ratio("json"),
        target=2.0,
        note="target applies where serving overhead matters; EfficientNet here is compute-bound",
        needs_headroom=("json", CLS),
    ),
    Metric(
        "Triton ÷ peer, same binary-tensor payload, equal p99",
        _peer_ratio("binary"),
        target=2.0,
        note="as above",
        needs_headroom=("binary", CLS),
    ),
    Metric(
        "embed served ÷ raw embed pipeline, saturation (gRPC, short texts)",
        lambda rows, raw: _ratio(_saturated(rows, **_triton(EMB)), _raw_best("embed")(raw)),
    ),
    Metric(
        "embed served ÷ raw embed pipeline, concurrency 1 (gRPC)",
        lambda rows, raw: _ratio(_thr(rows, **_triton(EMB, level=1)), raw.get("embed", {}).get(1)),
    ),
    Metric(
        "embed response-cache hits ÷ computed embeddings (HTTP JSON, c=16)",
        lambda rows, raw: _ratio(
            _thr(rows, **_triton(EMB, "http", payload="json", level=16, dataset="repeated")),
            _thr(rows, **_triton(EMB, "http", payload="json", level=16)),
        ),
    ),
    Metric(
        "INT8 ÷ fp32 encoder, served embed (gRPC, c=16)",
        lambda rows, raw: _ratio(
            _thr(rows, **_triton(EMB8, level=16)), _thr(rows, **_triton(EMB, level=16))
        ),
    ),
    Metric(
        "INT8 ÷ fp32 encoder, raw embed pipeline (best batch)",
        lambda rows, raw: _ratio(_raw_best("embed_int8")(raw), _raw_best("embed")(raw)),
    ),
    Metric(
        "Triton ÷ peer (embed, same JSON payload), equal p99",
        _peer_ratio("json", EMB),
        target=2.0,
        needs_headroom=("json", EMB),
    ),
    Metric(
        "Triton ÷ peer (embed_graph: one process, same JSON payload), equal p99",
        _peer_ratio("json", GRAPH, peer_model=EMB),
        target=2.0,
        needs_headroom=("json", EMB),
    ),
    *(
        Metric(
            f"{model} ÷ peer texts/s at concurrency {level} (HTTP JSON)",
            _vs_peer_at(model, level),
            target=1.2 if level in (8, 32) else None,
        )
        for model in (EMB, GRAPH)
        for level in (1, 8, 32)
    ),
    *(
        Metric(
            f"{model} p99 ÷ peer p99 at concurrency {level} (HTTP JSON)",
            _vs_peer_at(model, level, "p99_ms"),
            target=1.0,
            higher_is_better=False,
        )
        for model in (EMB, GRAPH)
        for level in (1, 8, 32)
    ),
    Metric(
        "embed_graph served ÷ raw embed pipeline, saturation (gRPC, short texts)",
        lambda rows, raw: _ratio(_saturated(rows, **_triton(GRAPH)), _raw_best("embed")(raw)),
        target=0.9,
    ),
    *(
        Metric(
            f"embed ÷ infinity-emb texts/s at concurrency {level} (async calls, same core)",
            _vs_infinity(EMBED_ASYNC, level),
            target=INFINITY_TARGET,
            needs_headroom=("openai", EMB),
        )
        for level in (1, 8, 32)
    ),
    *(
        Metric(
            f"embed p99 ÷ infinity-emb p99 at concurrency {level} (async calls)",
            _vs_infinity(EMBED_ASYNC, level, "p99_ms"),
            higher_is_better=False,
        )
        for level in (1, 8, 32)
    ),
    *(
        Metric(
            f"FastAPI peer ÷ infinity-emb texts/s at concurrency {level} (async calls)",
            _vs_infinity(PEER_ASYNC, level),
        )
        for level in (1, 8, 32)
    ),
    Metric(
        "load generator headroom, OpenAI /embeddings (null server ÷ infinity-emb's best)",
        _generator_headroom("openai", EMB),
        target=2.0,
        note="as above",
    ),
    Metric(
        "Triton cache hits ÷ peer (embed, same JSON payload), equal p99",
        _peer_ratio("json", EMB, dataset="repeated"),
        target=2.0,
        note="repeated queries; the peer has no cache, as a plain FastAPI service",
        needs_headroom=("json", EMB),
    ),
    Metric(
        "load generator headroom, embed JSON (null model or cache hits ÷ fastest computed)",
        _generator_headroom("json", EMB),
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
        return _ratio(ours and ours[field], theirs and theirs[field])

    return compute


# The embedding service's targets, each a ratio within one round (docs/performance.md).
TARGETS = [
    *(
        Metric(
            f"short texts, c={level}: embed ÷ FastAPI batcher, texts/s",
            _vs_peer_async(level),
            target=1.0,
            needs_headroom=("json", EMB),
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
            _mixed("embed", level, vs=other),
            target=2.0,
        )
        for level in (8, 32)
        for other in ("FastAPI peer", "infinity-emb")
    ),
    *(
        Metric(
            f"mixed lengths, c={level}: embed p99 ÷ {other} p99",
            _mixed("embed", level, "p99_ms", vs=other),
            target=1.0,
            higher_is_better=False,
        )
        for level in (8, 32)
        for other in ("FastAPI peer", "infinity-emb")
    ),
    *(
        Metric(
            f"mixed lengths, c={level}: embed padded ÷ real tokens",
            _mixed("embed", level, "padding"),
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
        if metric.needs_headroom:
            headroom = [
                _generator_headroom(*metric.needs_headroom)([r for r in rows if r["round"] == n], c)
                for n, c in rounds.items()
            ]
            if any(h is not None and h < 2 for h in headroom):
                # The load generator, not either server, set these numbers.
                table.append(
                    {
                        "metric": metric,
                        "values": values,
                        "median": median,
                        "low": low,
                        "high": high,
                        "met": None,
                        "capped": True,
                    }
                )
                continue
        table.append(
            {
                "metric": metric,
                "values": values,
                "median": median,
                "low": low,
                "high": high,
                "met": metric.met(median),
            }
        )
    return table


def _fmt(value: float, unit: str = "x") -> str:
    return f"{value:.3f}{unit}" if unit == " ms" else f"{value:.2f}{unit}"


def case_table(rows: list[dict]) -> list[dict]:
    """Median and spread of throughput and latencies per case over rounds."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in find(rows):
        groups[tuple(row[k] for k in CASE_FIELDS)].append(row)
    out = []
    for key, members in groups.items():
        entry = dict(zip(CASE_FIELDS, key, strict=True))
        for field in (
            "throughput",
            "p50_ms",
            "p99_ms",
            f"{CLS}_avg_batch",
            f"{FUSED}_avg_batch",
            "encoder_avg_batch",
            f"{embedding.TOKENIZE_ENCODE}_avg_batch",
        ):
            values = [m[field] for m in members if m.get(field) not in ("", None)]
            entry[field] = summarize(values) if values else None
        out.append(entry)
    return sorted(out, key=lambda e: (*(str(e[k]) for k in CASE_FIELDS[:-1]), e["level"]))


def _median_cell(values: list[float], digits: int = 1) -> str:
    if not values:
        return "not measured"
    med, low, high = summarize(values)
    return f"{med:.{digits}f} [{low:.{digits}f} – {high:.{digits}f}]"


def embedding_servers(rows: list[dict]) -> list[str]:
    """embed, the FastAPI peer and infinity-emb at infinity's levels, and embed ÷ infinity.

    All three with asynchronous calls from the same perf_analyzer and the same texts; empty if
    infinity-emb was not part of the run.
    """
    infinity = [r for r in rows if r["system"] == "infinity"]
    if not infinity:
        return []
    levels = sorted({r["level"] for r in infinity})
    lines = [
        "",
        "## Embedding servers side by side (median [min – max] over rounds)",
        "",
        "Same texts, one per request, same perf_analyzer with asynchronous calls, every server "
        "on the same cores: `embed` (Triton, KServe v2 JSON), the FastAPI peer (KServe v2 JSON) "
        "and infinity-emb (OpenAI-style `POST /embeddings`).",
        "",
        "| server | concurrency | texts/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    servers = (("embed", EMBED_ASYNC), ("FastAPI peer", PEER_ASYNC), ("infinity-emb", INFINITY))
    for level in levels:
        for name, match in servers:
            found = find(rows, **match, mode="concurrency", level=level)
            cells = [
                _median_cell([r[f] for r in found], d)
                for f, d in (("throughput", 1), ("p50_ms", 2), ("p99_ms", 2))
            ]
            errors = [r["error"] for r in rows if r["system"] == match["system"] and r["error"]]
            if not found and name == "infinity-emb" and errors:
                cells = [f"not measured: {errors[0].splitlines()[0]}", "", ""]
            lines.append(f"| {name} | {level:g} | " + " | ".join(cells) + " |")
    lines += ["", "| ratio | " + " | ".join(f"c={v:g}" for v in levels) + " |"]
    lines.append("|---|" + "---|" * len(levels))
    for name, match, field in (
        ("embed ÷ infinity-emb, texts/s", EMBED_ASYNC, "throughput"),
        ("embed ÷ infinity-emb, p99", EMBED_ASYNC, "p99_ms"),
        ("FastAPI peer ÷ infinity-emb, texts/s", PEER_ASYNC, "throughput"),
    ):
        cells = []
        for level in levels:
            values = []
            for round_ in sorted({r["round"] for r in rows}):
                value = _vs_infinity(match, int(level), field)(
                    [r for r in rows if r["round"] == round_], {}
                )
                if value is not None:
                    values.append(value)
            cells.append(_median_cell(values, 2))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    met = [
        _vs_infinity(EMBED_ASYNC, int(level))([r for r in rows if r["round"] == n], {})
        for level in levels
        for n in sorted({r["round"] for r in rows})
    ]
    met = [m for m in met if m is not None]
    if met:
        verdict = "met" if min(met) >= INFINITY_TARGET else "**not met**"
        lines += [
            "",
            f"Target embed ≥ {INFINITY_TARGET}x infinity-emb (texts/s, every level and round): "
            f"{verdict} (lowest {min(met):.2f}x).",
        ]
    return lines


def _per_round(rows: list[dict], compute, raw: dict[int, dict] | None = None) -> list[float]:
    values = []
    for n in sorted({r["round"] for r in rows}):
        value = compute([r for r in rows if r["round"] == n], (raw or {}).get(n, {}))
        if value is not None:
            values.append(value)
    return values


def mixed_lengths(rows: list[dict], raw: dict[int, dict]) -> list[str]:
    """The mixed-length table: each server's texts/s, p99 and padding; ratios; raw limits."""
    mixed = [r for r in rows if r["dataset"] == "mixed"]
    if not mixed:
        return []
    levels = sorted({r["level"] for r in mixed})
    lines = [
        "",
        "## Mixed lengths (median [min – max] over rounds)",
        "",
        "70 % single sentences, 30 % passages of 80-250 words, every text distinct "
        "(`export.text_samples.mixed_texts`), one per request, asynchronous calls, every server "
        "on the same cores, embed's response cache off. Padded ÷ real: token positions the "
        "encoder ran over the real word pieces (embed: pipeline_padded_tokens_total ÷ "
        "pipeline_tokens_total over the case; the FastAPI peer: its batcher's counts).",
        "",
        "| server | concurrency | texts/s | p50 ms | p99 ms | padded ÷ real |",
        "|---|---|---|---|---|---|",
    ]
    for level in levels:
        for name, match in MIXED.items():
            found = find(rows, **match, mode="concurrency", level=level)
            cells = [
                _median_cell([r[f] for r in found], d)
                for f, d in (("throughput", 1), ("p50_ms", 2), ("p99_ms", 2))
            ]
            padding = [p for p in map(padding_ratio, found) if p is not None]
            cells.append(
                _median_cell(padding, 2)
                if padding
                else ("not observable" if name == "infinity-emb" else "not measured")
            )
            errors = [
                r["error"]
                for r in rows
                if r["system"] == match["system"] and r["dataset"] == "mixed" and r["error"]
            ]
            if not found and errors:
                cells = [f"not measured: {errors[0].splitlines()[0]}", "", "", ""]
            lines.append(f"| {name} | {level:g} | " + " | ".join(cells) + " |")
    lines += ["", "| ratio | " + " | ".join(f"c={v:g}" for v in levels) + " |"]
    lines.append("|---|" + "---|" * len(levels))
    for label, field, other in (
        ("embed ÷ FastAPI peer, texts/s", "throughput", "FastAPI peer"),
        ("embed ÷ infinity-emb, texts/s", "throughput", "infinity-emb"),
        ("embed ÷ FastAPI peer, p99", "p99_ms", "FastAPI peer"),
        ("embed ÷ infinity-emb, p99", "p99_ms", "infinity-emb"),
    ):
        cells = [
            _median_cell(_per_round(rows, _mixed("embed", int(v), field, vs=other)), 2)
            for v in levels
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    kinds = (("padded to its longest text", "mixed_padded"), ("sorted sub-batches", "mixed_sorted"))
    if any(kind in curves for curves in raw.values() for _, kind in kinds):
        lines += [
            "",
            "Raw engine in-process over the same texts (tokenize + encoder, one process, the "
            "server's cores and threads), consecutive texts per batch:",
            "",
            "| batching | batch size | texts/s | padded ÷ real |",
            "|---|---|---|---|",
        ]
        for label, kind in kinds:
            sizes = sorted({bs for curves in raw.values() for bs in curves.get(kind, {})})
            for bs in sizes:
                cells = [
                    _median_cell([c[k][bs] for c in raw.values() if bs in c.get(k, {})], d)
                    for k, d in ((kind, 1), (f"{kind}_ratio", 2))
                ]
                lines.append(f"| {label} | {bs} | " + " | ".join(cells) + " |")
    return lines


def _metric_lines(table: list[dict]) -> list[str]:
    lines = []
    for item in table:
        metric = item["metric"]
        if not item["values"]:
            shown = f"n/a: {item['why']}" if item.get("why") else "not measured"
            lines.append(f"| {metric.name} | {shown} | | |")
            continue
        measured = (
            f"{_fmt(item['median'], metric.unit)} "
            f"[{_fmt(item['low'], metric.unit)} – {_fmt(item['high'], metric.unit)}]"
        )
        target = (
            ""
            if metric.target is None
            else (("≥ " if metric.higher_is_better else "≤ ") + _fmt(metric.target, metric.unit))
        )
        met = {None: "", True: "yes", False: "**no**"}[item["met"]]
        if item.get("capped"):
            met = "n/a: capped by the load generator (headroom < 2)"
        note = f" ({metric.note})" if metric.note else ""
        lines.append(f"| {metric.name}{note} | {measured} | {target} | {met} |")
    return lines


def embedding_targets(rows: list[dict], raw: dict[int, dict]) -> list[str]:
    """The embedding service's targets, pass or fail, from ratios within each round."""
    return [
        "",
        "## Embedding targets (ratios within a round; median [min – max] over rounds)",
        "",
        "| target | measured | target | met |",
        "|---|---|---|---|",
        *_metric_lines(metric_table(rows, raw, TARGETS)),
    ]


def write_markdown(
    path: Path,
    rows: list[dict],
    raw: dict[int, dict],
    method: list[str],
    plots: list[Path],
    sections: list[str] = (),
) -> Path:
    """The report: method, targets, ``sections`` (more lines), raw curves, every case, plots."""
    lines = ["# Performance report", "", "## Method", ""] + [f"- {m}" for m in method] + [""]
    lines += [
        "## Targets (median over rounds, [min – max])",
        "",
        "| metric | measured | target | met |",
        "|---|---|---|---|",
    ]
    lines += _metric_lines(metric_table(rows, raw))
    lines += list(sections)
    lines += embedding_targets(rows, raw)
    lines += embedding_servers(rows)
    lines += mixed_lengths(rows, raw)
    if any(kind in curves for curves in raw.values() for kind in ("model", "pipeline")):
        lines += [
            "",
            "## Raw engine in-process (images/s, median over rounds)",
            "",
            "| kind | batch size | images/s |",
            "|---|---|---|",
        ]
    for kind in ("model", "pipeline"):
        sizes = sorted({bs for curves in raw.values() for bs in curves.get(kind, {})})
        for bs in sizes:
            values = [curves[kind][bs] for curves in raw.values() if bs in curves.get(kind, {})]
            med, low, high = summarize(values)
            lines.append(f"| {kind} | {bs} | {med:.1f} [{low:.1f} – {high:.1f}] |")
    lines += [
        "",
        "## Every case (median [min – max] over rounds)",
        "",
        "| system | variant | model | protocol | payload | calls | mode | level | infer/s | "
        "p50 ms | p99 ms | formed batch (classifier, classify_fused, tokenize_encode or encoder) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in case_table(rows):

        def cell(field, digits=1, e=e):
            v = e[field]
            return "" if v is None else f"{v[0]:.{digits}f} [{v[1]:.{digits}f} – {v[2]:.{digits}f}]"

        model = e["model"] + ("" if e["dataset"] == "samples" else f" [{e['dataset']}]")
        batch_field = f"{CLS}_avg_batch"
        if e["model"] == FUSED:
            batch_field = f"{FUSED}_avg_batch"  # the one step that batches
        if e["model"] in (EMB, EMB8):
            # The step that batches: tokenize_encode where embed is that one step.
            batch_field = f"{embedding.TOKENIZE_ENCODE}_avg_batch"
            if e[batch_field] is None:
                batch_field = "encoder_avg_batch"
        lines.append(
            f"| {e['system']} | {e['variant']} | {model} | {e['protocol']} | {e['payload']} | "
            f"{e['calls']} | {e['mode']} | {e['level']:g} | {cell('throughput')} | "
            f"{cell('p50_ms', 2)} | {cell('p99_ms', 2)} | {cell(batch_field, 2)} |"
        )
    failures = [r for r in rows if r.get("error")]
    if failures:
        lines += ["", "## Failed measurements", ""]
        lines += [
            f"- round {r['round']} {r['system']}/{r['variant']} {r['model']} {r['protocol']} "
            f"{r['mode']}={r['level']}: {r['error'].splitlines()[0]}"
            for r in failures
        ]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    path.write_text("\n".join(lines) + "\n")
    return path


def _save(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """Log2 x axis, labels, grid, legend; write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(out_dir: Path, rows: list[dict], raw: dict[int, dict]) -> list[Path]:
    """Throughput vs p50/p99 per variant; formed batch size; raw vs served."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = case_table(rows)
    series: dict[tuple, list[dict]] = defaultdict(list)
    for e in cases:
        # Cache hits and the null peer are another regime (thousands/s): the table has them.
        if (
            e["mode"] == "concurrency"
            and e["throughput"]
            and e["dataset"] == "samples"
            and e["system"] != "null-peer"
        ):
            key = (e["system"], e["variant"], e["model"], e["protocol"], e["payload"], e["calls"])
            series[key].append(e)
    paths = []

    fig, axes = plt.subplots(1, 3, figsize=(20, 5.5), sharey=False)
    for ax, models in zip(axes, ((ENS,), (CLS,), (EMB, EMB8)), strict=True):
        for key, points in sorted(series.items()):
            if key[2] not in models:
                continue
            points.sort(key=lambda e: e["level"])
            x = [e["throughput"][0] for e in points]
            label = "/".join(
                k for k in (key[0], key[1], key[3], key[4], key[5]) if k not in ("-", "sync")
            )
            (line,) = ax.plot(x, [e["p50_ms"][0] for e in points], "o-", label=f"{label} p50")
            ax.plot(
                x,
                [e["p99_ms"][0] for e in points],
                "x--",
                color=line.get_color(),
                label=f"{label} p99",
            )
        ax.set_title(f"{' / '.join(models)}: latency vs throughput (concurrency sweep)")
        ax.set_xlabel("throughput (infer/s)")
        ax.set_ylabel("latency (ms)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "latency_vs_throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, points in sorted(series.items()):
        if key[0] != "triton" or key[2] not in (ENS, CLS) or key[4] != "binary":
            continue
        points = [e for e in sorted(points, key=lambda e: e["level"]) if e[f"{CLS}_avg_batch"]]
        if points:
            ax.plot(
                [e["level"] for e in points],
                [e[f"{CLS}_avg_batch"][0] for e in points],
                "o-",
                label=f"{key[1]} {key[2]} {key[3]}",
            )
    paths.append(
        _save(
            fig,
            ax,
            out_dir / "formed_batch_size.png",
            "client concurrency",
            "classifier: average formed batch",
            "Formed batch size (statistics API)",
        )
    )

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind in ("model", "pipeline"):
        sizes = sorted({bs for c in raw.values() for bs in c.get(kind, {})})
        if not sizes:
            continue
        med = [
            statistics.median(c[kind][bs] for c in raw.values() if bs in c[kind]) for bs in sizes
        ]
        ax.plot(sizes, med, "o-", label=f"raw {kind} (in-process, by batch size)")
    for key in ((CLS, "classifier served"), (ENS, "classify served")):
        points = series.get(("triton", "batching", key[0], "grpc", "binary", "sync"), [])
        points = sorted(points, key=lambda e: e["level"])
        if points:
            ax.plot(
                [e["level"] for e in points],
                [e["throughput"][0] for e in points],
                "s--",
                label=f"{key[1]} gRPC (by concurrency)",
            )
    paths.append(
        _save(
            fig,
            ax,
            out_dir / "raw_vs_served.png",
            "batch size (raw) / concurrency (served)",
            "images/s",
            "Raw engine vs served",
        )
    )
    return paths
