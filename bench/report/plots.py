"""The report's plots: throughput and latency by load, per model and protocol."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from bench.report.markdown import case_table
from bench.report.points import CLS, EMB, EMB8, ENS


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
