"""The report's plots: throughput and latency by load, per model and protocol."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from bench.report.markdown import case_table
from pipelines import classification, embedding


def _label(ax, xlabel: str, ylabel: str, title: str, log2_x: bool = True) -> None:
    """Axis labels and title, a light grid, and the legend if anything is labelled."""
    if log2_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _write(fig, path: Path) -> Path:
    """Write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class _Series(NamedTuple):
    """What one curve of a concurrency sweep holds fixed (sorts as the tuple of its fields)."""

    system: str
    variant: str
    model: str
    protocol: str
    payload: str
    calls: str


def write_plots(out_dir: Path, rows: list[dict], raw: dict[int, dict]) -> list[Path]:
    """Throughput vs p50/p99 per variant; formed batch size; raw vs served."""
    import matplotlib

    matplotlib.use("Agg")
    series = _sweeps(rows)
    return [
        _latency_vs_throughput(series, out_dir / "latency_vs_throughput.png"),
        _formed_batch_size(series, out_dir / "formed_batch_size.png"),
        _raw_vs_served(series, raw, out_dir / "raw_vs_served.png"),
    ]


def _sweeps(rows: list[dict]) -> dict[_Series, list[dict]]:
    """The cases of each concurrency sweep on the usual texts and images, by level."""
    series: dict[_Series, list[dict]] = defaultdict(list)
    for e in case_table(rows):
        # Cache hits and the null peer are another regime (thousands/s): the table has them.
        if (
            e["mode"] == "concurrency"
            and e["throughput"]
            and e["dataset"] == "samples"
            and e["system"] != "null-peer"
        ):
            series[_Series(*(e[field] for field in _Series._fields))].append(e)
    for points in series.values():
        points.sort(key=lambda e: e["level"])
    return series


def _latency_vs_throughput(series: dict[_Series, list[dict]], path: Path) -> Path:
    """p50 and p99 against throughput: the classify ensemble, the classifier, embed."""
    import matplotlib.pyplot as plt

    panels = (
        (classification.ENSEMBLE,),
        (classification.CLASSIFIER,),
        (embedding.ENSEMBLE, embedding.INT8_ENSEMBLE),
    )
    fig, axes = plt.subplots(1, 3, figsize=(20, 5.5), sharey=False)
    for ax, models in zip(axes, panels, strict=True):
        for key, points in sorted(series.items()):
            if key.model not in models:
                continue
            x = [e["throughput"][0] for e in points]
            label = "/".join(
                k
                for k in (key.system, key.variant, key.protocol, key.payload, key.calls)
                if k not in ("-", "sync")
            )
            (line,) = ax.plot(x, [e["p50_ms"][0] for e in points], "o-", label=f"{label} p50")
            ax.plot(
                x,
                [e["p99_ms"][0] for e in points],
                "x--",
                color=line.get_color(),
                label=f"{label} p99",
            )
        _label(
            ax,
            "throughput (infer/s)",
            "latency (ms)",
            f"{' / '.join(models)}: latency vs throughput (concurrency sweep)",
            log2_x=False,
        )
    return _write(fig, path)


def _formed_batch_size(series: dict[_Series, list[dict]], path: Path) -> Path:
    """The classifier's average formed batch by concurrency (Triton, binary payloads)."""
    import matplotlib.pyplot as plt

    batch = f"{classification.CLASSIFIER}_avg_batch"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, points in sorted(series.items()):
        if (
            key.system != "triton"
            or key.model not in (classification.ENSEMBLE, classification.CLASSIFIER)
            or key.payload != "binary"
        ):
            continue
        measured = [e for e in points if e[batch]]
        if measured:
            ax.plot(
                [e["level"] for e in measured],
                [e[batch][0] for e in measured],
                "o-",
                label=f"{key.variant} {key.model} {key.protocol}",
            )
    _label(
        ax,
        "client concurrency",
        "classifier: average formed batch",
        "Formed batch size (statistics API)",
    )
    return _write(fig, path)


def _raw_vs_served(series: dict[_Series, list[dict]], raw: dict[int, dict], path: Path) -> Path:
    """The raw curves by batch size (median over rounds) beside served images/s by concurrency."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind in ("model", "pipeline"):
        sizes = sorted({bs for c in raw.values() for bs in c.get(kind, {})})
        if not sizes:
            continue
        med = [
            statistics.median(c[kind][bs] for c in raw.values() if bs in c[kind]) for bs in sizes
        ]
        ax.plot(sizes, med, "o-", label=f"raw {kind} (in-process, by batch size)")
    for model, name in (
        (classification.CLASSIFIER, "classifier served"),
        (classification.ENSEMBLE, "classify served"),
    ):
        points = series.get(_Series("triton", "batching", model, "grpc", "binary", "sync"), [])
        if points:
            ax.plot(
                [e["level"] for e in points],
                [e["throughput"][0] for e in points],
                "s--",
                label=f"{name} gRPC (by concurrency)",
            )
    _label(ax, "batch size (raw) / concurrency (served)", "images/s", "Raw engine vs served")
    return _write(fig, path)
