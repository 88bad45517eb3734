"""Side by side: the same perf_analyzer load on several servers, rounds interleaved.

Each round starts every system in turn (the first one rotating), measures each model at each
concurrency, and stops it; a busy machine then slows each system alike. The table gives each
system's rate and p99 per round and its median rate over the first system's.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from bench.harness import inputs, perf_analyzer

log = logging.getLogger(__name__)

# A system: a context manager that runs one server and yields its gRPC host:port.
System = Callable[[], contextlib.AbstractContextManager[str]]
Points = dict[tuple[str, str, int], list[perf_analyzer.Point]]
T = TypeVar("T")


def interleaved(
    systems: Mapping[str, System],
    models: Sequence[str],
    levels: Sequence[int],
    rounds: int,
    measurement_ms: int,
    load_cpus: list[int] | None,
) -> Points:
    """``(system, model, level) → [point of each round]`` (perf_analyzer on ``load_cpus``)."""
    names = list(systems)
    points: Points = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = {model: inputs.write(model, Path(tmp)) for model in models}
        for r in range(rounds):
            for name in rotation(names, r):
                with systems[name]() as grpc_url:
                    for model in models:
                        run = perf_analyzer.Run(
                            model,
                            grpc_url,
                            input_data=data[model],
                            measurement_ms=measurement_ms,
                            cpus=load_cpus,
                        )
                        for level in levels:
                            point = perf_analyzer.measure(run, level)
                            points.setdefault((name, model, level), []).append(point)
                            log.info(
                                "round %d %-8s %-8s c=%-3d %7.1f /s  p99 %6.1f ms",
                                r + 1, name, model, level, point.throughput, point.p99_ms,
                            )  # fmt: skip
    return points


def table(points: Points, systems: Sequence[str], models: Sequence[str], levels: Sequence[int]):
    """The markdown table: rate and p99 of each round, median rate ÷ the first system's."""
    base_name = systems[0]
    lines = [
        f"| system | model | c | rate /s (rounds) | p99 ms (rounds) | ÷ {base_name} (medians) |",
        "|---|---|---|---|---|---|",
    ]
    for model in models:
        for level in levels:
            base = median_rate(points[(base_name, model, level)])
            for name in systems:
                got = points[(name, model, level)]
                rates, p99s = per_round(got)
                lines.append(
                    f"| {name} | {model} | {level} | {rates} | {p99s} | "
                    f"{median_rate(got) / base:.2f}x |"
                )
    return "\n".join(lines)


def rotation(names: Sequence[T], round_: int) -> list[T]:
    """The order of round ``round_`` (from 0): each round another system goes first."""
    first = round_ % len(names)
    return [*names[first:], *names[:first]]


def median_rate(points: Sequence[perf_analyzer.Point]) -> float:
    """The median throughput of one case's rounds."""
    return statistics.median(p.throughput for p in points)


def per_round(points: Sequence[perf_analyzer.Point]) -> tuple[str, str]:
    """One case's rate and p99 in each round, comma-separated: ``("812.3, 799.0", "9.1, 9.4")``."""
    return (
        ", ".join(f"{p.throughput:.1f}" for p in points),
        ", ".join(f"{p.p99_ms:.1f}" for p in points),
    )


def arguments(
    argv: Sequence[str] | None,
    doc: str,
    example: str,
    defaults: tuple[int, str, int],
    more: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The command line every side-by-side benchmark shares, parsed (and logging set up).

    ``defaults``: rounds, levels ("8,32") and the measurement window in ms; ``more`` adds a
    benchmark's own options. ``levels`` comes back as a list of concurrencies.
    """
    rounds, levels, measurement_ms = defaults
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=f"example: {example}")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--levels", default=levels, help="concurrencies, comma-separated")
    p.add_argument("--measurement-ms", type=int, default=measurement_ms)
    if more is not None:
        more(p)
    args = p.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return args
