"""The markdown report: method, targets, tables of every case, mixed lengths, plots."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.report.points import CASE_FIELDS, find
from bench.report.ratios import (
    EMBED_ASYNC,
    INFINITY,
    INFINITY_TARGET,
    MIXED,
    PEER_ASYNC,
    TARGETS,
    metric_table,
    mixed_metric,
    padding_ratio,
    summarize,
    vs_infinity,
)
from pipelines import classification, embedding


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
            f"{classification.CLASSIFIER}_avg_batch",
            f"{classification.FUSED}_avg_batch",
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
                value = vs_infinity(match, int(level), field)(
                    [r for r in rows if r["round"] == round_], {}
                )
                if value is not None:
                    values.append(value)
            cells.append(_median_cell(values, 2))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    met = [
        vs_infinity(EMBED_ASYNC, int(level))([r for r in rows if r["round"] == n], {})
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
            _median_cell(_per_round(rows, mixed_metric("embed", int(v), field, vs=other)), 2)
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
        batch_field = f"{classification.CLASSIFIER}_avg_batch"
        if e["model"] == classification.FUSED:
            batch_field = f"{classification.FUSED}_avg_batch"  # the one step that batches
        if e["model"] in (embedding.ENSEMBLE, embedding.INT8_ENSEMBLE):
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
