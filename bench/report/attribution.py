"""Where a request's time goes, step by step: the report's section and plot for traced cases.

The traced cases (``bench.harness``, variant ``traced``) ran with Triton's trace on; their
windows pick their requests out of the run's trace files (``bench.harness.trace``). Laid
beside them:

* at concurrency 1, the raw pipeline's stages timed on the same core just before and after the
  case (``bench.harness.raw.stage_times``): a step's compute minus the stages it runs is what
  serving that step costs beyond the functions themselves;
* perf_analyzer's client-side mean latency: minus the server's own span, what the client, the
  loopback and the protocol libraries cost;
* at saturation, the CPU time each process spent per image (the rows' ``cpu_ms_per_item``):
  where the core's time went when it had no idle moment, against the raw pipeline's.

Means throughout (a sum of medians is no median of the sum); medians over rounds of those.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from bench.harness import trace
from bench.harness.raw import STEP_STAGES
from pipelines import classification

PROTOCOLS = ("grpc", "http")
SATURATION = 16  # the traced level that keeps the core busy (and the untraced rows beside it)
# The kind of a step's compute beyond its raw stages: its own colour in the plot.
OVERHEAD = "compute beyond the raw functions"
TOLERANCE_MS = 0.5  # the attribution is claimed good to this; a wider drift is said
# The client's mean beyond the server's span: the client, the loopback and the protocol
# libraries, and whatever the server's processes still did on the core when the next request
# came (the steps' release after the send is one such thing: the figure above it).
OUTSIDE = "outside the server's span: client, loopback, work left from the last request"


def _key(row: dict) -> tuple:
    return row["round"], row["model"], row["protocol"], int(row["level"])


def breakdowns(rows: list[dict], out_dir: Path) -> tuple[dict[tuple, trace.Breakdown], list[str]]:
    """The mean path of each traced row's requests, from the run's trace files.

    Returns:
        ({(round, model, protocol, level): breakdown}, problems with the files or rows).
    """
    traced = [
        r
        for r in rows
        if r["variant"] == trace.VARIANT and r.get("window_start_ns") not in ("", None)
    ]
    if not traced:
        return {}, []
    traces, problems = trace.read((out_dir / trace.FOLDER).glob("trace-*.json*"))
    found = {}
    for row in traced:
        window = int(row["window_start_ns"]), int(row["window_end_ns"])
        result = trace.breakdown(trace.within(traces, row["model"], *window))
        if result is None:
            problems.append(f"round {row['round']} {row['model']} {row['protocol']} "
                            f"c={row['level']:g}: no complete trace in its window")  # fmt: skip
        else:
            found[_key(row)] = result
    return found, problems


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _cell(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _timings(row: dict) -> dict[str, dict[str, float]]:
    """The raw stages timed "before" and "after" a traced row (ms per image), as recorded."""
    return json.loads(row["raw_stage_ms"]) if row.get("raw_stage_ms") else {}


def _stages(row: dict) -> dict[str, float] | None:
    """The mean of the raw stages timed before and after a traced row (ms per image)."""
    timings = list(_timings(row).values())
    if not timings:
        return None
    return {k: statistics.fmean(t[k] for t in timings) for k in timings[0]}


def _drift(row: dict) -> float | None:
    """How far the raw pipeline's time moved between before and after the case (ms)."""
    timings = _timings(row)
    if len(timings) < 2:
        return None
    return abs(sum(timings["after"].values()) - sum(timings["before"].values()))


def _rows(rows: list[dict], model: str, protocol: str, level: int, variant: str) -> list[dict]:
    return [
        r
        for r in rows
        if r["variant"] == variant
        and r["system"] == "triton"
        and r["model"] == model
        and r["protocol"] == protocol
        and r["payload"] == "binary"
        and r["mode"] == "concurrency"
        and r.get("calls", "sync") == "sync"
        and r.get("dataset", "samples") == "samples"
        and int(r["level"]) == level
        and r.get("throughput") not in ("", None)
    ]


def concurrency_one(rows: list[dict], found: dict[tuple, trace.Breakdown], model: str) -> dict:
    """Per protocol, medians over rounds of each segment and of each share of the gap at c=1.

    Returns:
        {protocol: {"segments": [(name, kind, ms)], "raw": {segment: ms}, "figures": {...},
        "causes": {cause: ms}}} for the protocols traced.
    """
    out = {}
    for protocol in PROTOCOLS:
        per_round = []
        for row in _rows(rows, model, protocol, 1, trace.VARIANT):
            result, stages = found.get(_key(row)), _stages(row)
            if result is None or stages is None:
                continue
            plain = _rows(rows, model, protocol, 1, "batching")
            untraced = next((r["avg_ms"] for r in plain if r["round"] == row["round"]), None)
            cpu = json.loads(row["cpu_ms_per_item"]) if row.get("cpu_ms_per_item") else {}
            figures = _gap(result, stages, row["avg_ms"], untraced, _drift(row))
            figures["figures"]["CPU per request, every process of the server"] = (
                sum(cpu.values()) if cpu else None
            )
            per_round.append(figures)
        if not per_round:
            continue
        segments = [
            (name, kind, statistics.median(p["segments"][i][2] for p in per_round))
            for i, (name, kind, _) in enumerate(per_round[0]["segments"])
        ]
        merged = {}
        for part in ("raw", "figures", "causes"):
            names = dict.fromkeys(k for p in per_round for k in p[part])
            merged[part] = {
                k: _median([p[part][k] for p in per_round if p[part].get(k) is not None])
                for k in names
            }
        out[protocol] = {"segments": segments, "rounds": len(per_round), **merged}
    return out


def _gap(
    result: trace.Breakdown,
    stages: dict[str, float],
    client_ms: float,
    untraced_ms: float | None,
    drift: float | None,
) -> dict:
    """One round's c=1 figures: the path, its raw counterparts, and the gap split by cause."""
    raw = {}
    causes: dict[str, float] = defaultdict(float)
    for name, kind, ms in result.segments:
        step = name.split(":")[0]
        if kind == trace.COMPUTE and step in STEP_STAGES:
            raw[name] = sum(stages[s] for s in STEP_STAGES[step])
            causes[f"{step}: compute beyond its raw functions"] += ms - raw[name]
        elif kind in (trace.QUEUE, trace.INPUT, trace.OUTPUT):
            causes[f"{kind} (every step)"] += ms
        else:
            causes["front end and ensemble scheduling"] += ms
    server = result.total_ms
    causes[OUTSIDE] = client_ms - server
    pipeline = sum(stages.values())
    figures = {
        "server, read to sent": server,
        "steps still releasing after the send (off the path)": result.release_ms,
        "client mean, traced": client_ms,
        "client mean, untraced (same round)": untraced_ms,
        "raw pipeline, one image (its stages)": pipeline,
        "gap: client mean, traced − raw pipeline": client_ms - pipeline,
        "raw pipeline before vs after the case (drift)": drift,
    }
    return {"segments": result.segments, "raw": raw, "figures": figures, "causes": dict(causes)}


def cpu_split(rows: list[dict], model: str, protocol: str) -> dict[str, float] | None:
    """CPU ms per image by process at saturation (untraced), median over rounds."""
    found = [
        json.loads(r["cpu_ms_per_item"])
        for r in _rows(rows, model, protocol, SATURATION, "batching")
        if r.get("cpu_ms_per_item")
    ]
    if not found:
        return None
    names = dict.fromkeys(n for f in found for n in f)
    return {n: statistics.median(f.get(n, 0.0) for f in found) for n in names}


def _models(rows: list[dict]) -> list[str]:
    """The traced models, the ensemble first."""
    traced = {r["model"] for r in rows if r["variant"] == trace.VARIANT}
    return sorted(traced, key=lambda m: (m != classification.ENSEMBLE, m))


def section(rows: list[dict], raw: dict[int, dict], found: dict, problems: list[str]) -> list[str]:
    """The report's section: c=1 path and gap per model, saturation path, CPU per image."""
    if not found and not problems:
        return []
    lines = [
        "",
        "## Where a request's time goes, step by step (Triton's trace)",
        "",
        "Every request traced (`--trace-config`, level TIMESTAMPS) while perf_analyzer ran; each "
        "request laid out along its path through the server (`bench/harness/trace.py`), means "
        "over the requests of a case (its first tenth left out), medians over rounds. The raw "
        "pipeline's stages (`python -m bench.harness.raw --stages`) were timed on the server's "
        "core right before and after each case at concurrency 1, the server idle.",
    ]
    for model in _models(rows):
        c1 = concurrency_one(rows, found, model)
        if c1:
            lines += _c1_lines(model, c1)
    lines += _saturation(rows, raw, found)
    if problems:
        lines += ["", "Not read: " + "; ".join(problems)]
    return lines


def _c1_lines(model: str, c1: dict) -> list[str]:
    protocols = [p for p in PROTOCOLS if p in c1]
    head = " | ".join(f"{p} ms" for p in protocols)
    lines = ["", f"### `{model}` at concurrency 1", "", f"| segment | {head} | raw pipeline ms |"]
    lines.append("|---|" + "---|" * (len(protocols) + 1))
    first = c1[protocols[0]]
    for i, (name, _, _) in enumerate(first["segments"]):
        cells = [_cell(c1[p]["segments"][i][2]) for p in protocols]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_cell(first['raw'].get(name))} |")
    for name in first["figures"]:
        cells = [_cell(c1[p]["figures"].get(name)) for p in protocols]
        lines.append(f"| **{name}** | " + " | ".join(cells) + " | |")
    lines += ["", "The gap, by cause (ms; the causes add up to the gap):", ""]
    lines += [f"| cause | {head} |", "|---|" + "---|" * len(protocols)]
    for name in first["causes"]:
        cells = [_cell(c1[p]["causes"].get(name)) for p in protocols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for p in protocols:
        drift = c1[p]["figures"].get("raw pipeline before vs after the case (drift)")
        if drift is not None and drift > TOLERANCE_MS:
            lines.append(
                f"\n{p}: the raw pipeline's time moved by {drift:.2f} ms between its two "
                "timings (the machine's speed drifts), so the compute shares are good to "
                "about that, not to the 0.5 ms asked."
            )
    return lines


def _saturation(rows: list[dict], raw: dict[int, dict], found: dict) -> list[str]:
    lines = []
    for model in _models(rows):
        traced = {
            p: [
                found[_key(r)]
                for r in _rows(rows, model, p, SATURATION, trace.VARIANT)
                if _key(r) in found
            ]
            for p in PROTOCOLS
        }
        protocols = [p for p in PROTOCOLS if traced[p]]
        if not protocols:
            continue
        head = " | ".join(f"{p} ms" for p in protocols)
        lines += [
            "",
            f"### `{model}` at concurrency {SATURATION}: one request's path",
            "",
            f"| segment | {head} |",
            "|---|" + "---|" * len(protocols),
        ]
        for name, _, _ in traced[protocols[0]][0].segments:
            cells = [_cell(_median([b.get(name) for b in traced[p]])) for p in protocols]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    splits = {
        f"{model} {p}": split
        for model in _models(rows)
        for p in PROTOCOLS
        if (split := cpu_split(rows, model, p))
    }
    if not splits:
        return lines
    best = [max(c["pipeline"].values()) for c in raw.values() if c.get("pipeline")]
    lines += [
        "",
        f"CPU time per image at concurrency {SATURATION} (untraced), by process, ms: the core was "
        "never idle, so they add up to what one image cost it. The raw pipeline in-process at "
        "its best batch, for comparison:",
        "",
        "| process | " + " | ".join(splits) + " |",
        "|---|" + "---|" * len(splits),
    ]
    # The models' own processes: the server's other stubs were idle.
    names = [
        n
        for n in dict.fromkeys(n for split in splits.values() for n in split)
        if any(split.get(n, 0) >= 0.005 for split in splits.values())
    ]
    for name in names:
        lines.append(
            f"| {name} | " + " | ".join(_cell(s.get(name)) for s in splits.values()) + " |"
        )
    totals = [_cell(sum(s.values())) for s in splits.values()]
    lines.append("| **all of them** | " + " | ".join(totals) + " |")
    raw_ms = _cell(1000 / statistics.median(best)) if best else "–"
    lines.append(
        "| raw pipeline in-process, best batch | " + " | ".join([raw_ms] * len(splits)) + " |"
    )
    return lines


def plot(out_dir: Path, rows: list[dict], raw: dict[int, dict], found: dict) -> Path | None:
    """Stacked bars: c=1 paths by kind against the raw stages; CPU per image at saturation."""
    bars: list[tuple[str, dict[str, float]]] = []
    pipeline = None
    for model in _models(rows):
        for protocol, data in concurrency_one(rows, found, model).items():
            stacked: dict[str, float] = defaultdict(float)
            for name, kind, ms in data["segments"]:
                raw_ms = data["raw"].get(name)
                if raw_ms is not None:
                    stacked["raw functions"] += raw_ms
                    stacked[OVERHEAD] += ms - raw_ms
                else:
                    stacked[kind] += ms
            figures = data["figures"]
            stacked["outside the server's span"] += (
                figures["client mean, traced"] - figures["server, read to sent"]
            )
            pipeline = pipeline or figures["raw pipeline, one image (its stages)"]
            bars.append((f"{model} {protocol}", stacked))
    if pipeline is not None:
        bars.insert(0, ("raw pipeline", {"raw functions": pipeline}))
    cpu_bars = [
        (f"{model} {p}", split)
        for model in _models(rows)
        for p in PROTOCOLS
        if (split := cpu_split(rows, model, p))
    ]
    if not bars and not cpu_bars:
        return None
    best = [max(c["pipeline"].values()) for c in raw.values() if c.get("pipeline")]
    if cpu_bars and best:
        cpu_bars.insert(
            0, ("raw pipeline, best batch", {"raw pipeline": 1000 / statistics.median(best)})
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5))
    kinds = ["raw functions", OVERHEAD, *trace.KINDS, "outside the server's span"]
    _stack(left, bars, kinds, "ms per request (mean)", "Concurrency 1: where a request's time goes")
    # The models' own processes: the server's other stubs were idle.
    names = [
        n
        for n in dict.fromkeys(n for _, split in cpu_bars for n in split)
        if any(split.get(n, 0) >= 0.05 for _, split in cpu_bars)
    ]
    _stack(right, cpu_bars, names, "CPU ms per image", f"Concurrency {SATURATION}: CPU per image")
    fig.tight_layout()
    path = out_dir / "where_time_goes.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _stack(ax, bars: list[tuple[str, dict[str, float]]], kinds: list[str], xlabel: str, title: str):
    left = [0.0] * len(bars)
    for kind in kinds:
        widths = [max(0.0, parts.get(kind, 0.0)) for _, parts in bars]
        if any(w > 0.005 for w in widths):
            ax.barh([label for label, _ in bars], widths, left=left, label=kind)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
