"""Model Analyzer and ``bench tune`` side by side: the same targets, SLO, cores and time.

``python -m bench.tune_compare [TARGET ...] --rounds 2`` does, for each target:

1. Model Analyzer's quick search, and its brute search where it takes the target (one model,
   not an ensemble): ``bench.model_analyzer``;
2. ``bench tune`` with the time Model Analyzer's quick search took as its budget, all of it
   counted (raw curves included);
3. every pick measured again by one harness, ``bench tune``'s (the best throughput within the
   SLO, doubling the concurrency), beside the configs the repository serves now, alternately,
   ``--rounds`` times, each in a fresh server.

The server runs on the server's cores and every load generator on the others, for both tools.
``shared`` is one server that both services share, the classifier and the encoder loaded at
once: Model Analyzer profiles them concurrently, ``bench tune shared`` verifies pairs of each
model's best shapes, one perf_analyzer per model at the same concurrency. Writes
``compare.json``, ``report.md`` and ``compare.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import model_analyzer as ma
from bench import tune
from bench.harness import split_cores
from bench.tune_session import MODEL_ANALYZER, OURS, Session

log = logging.getLogger(__name__)

# The p99 SLO of each target (ms): the ones the tuner's documented runs use, and for the
# classifier and encoder alone what leaves their ensembles room for the other steps.
SLO_MS = {"classifier": 60.0, "encoder": 50.0, "classify": 100.0, "shared": 100.0}
SERVED = "served now"


@dataclass
class Entry:
    """One tool's search on one target, and its pick measured again."""

    target: str
    tool: str  # "bench tune", "Model Analyzer quick", "Model Analyzer brute"
    seconds: float
    configs: int  # configs (or candidates) measured by the search
    pick: str  # its label, or what went wrong
    own_throughput: float  # what the tool measured of its pick
    remeasured: list[float] = field(default_factory=list)  # by the one harness, per round

    @property
    def median(self) -> float | None:
        """The median re-measured throughput (None where it was not re-measured)."""
        return statistics.median(self.remeasured) if self.remeasured else None


def run_target(name: str, rounds: int, out: Path, cores) -> list[Entry]:
    """Both tools on one target, then their picks and the served configs re-measured alternately."""
    server_cpus, client_cpus = cores
    target = ma.target(name)
    slo = SLO_MS[name]
    entries: list[Entry] = []
    # The repository's configs as this machine serves them: the control every pick is beside.
    picks: dict[str, tune.Candidate | tune.Pick] = {SERVED: {}}
    entries.append(Entry(name, SERVED, 0.0, 0, "configs/local", 0.0))
    quick_seconds = None
    for mode in target.modes():
        tool = f"{MODEL_ANALYZER} {mode}"
        log.info("%s: %s, p99 <= %g ms", name, tool, slo)
        folder = out / f"ma-{mode}"
        outcome = ma.run(target, mode, slo, folder, server_cpus, client_cpus, progress=log.info)
        if mode == "quick":
            quick_seconds = outcome.seconds
        if outcome.best is None:
            what = f"nothing within the SLO (exit {outcome.returncode})"
            entries.append(Entry(name, tool, outcome.seconds, outcome.configs, what, 0.0))
            continue
        own = ma.number(outcome.best[ma.THROUGHPUT])
        picks[tool] = ma.pick(folder, outcome.best, target)
        label = tune.label(picks[tool])
        entries.append(Entry(name, tool, outcome.seconds, outcome.configs, label, own))
        log.info("  picked %s at %.1f/s (%.0f s)", label, own, outcome.seconds)
    if name in tune.TARGETS:
        budget = quick_seconds or 300.0
        log.info("%s: %s with %.0f s (Model Analyzer quick's time)", name, OURS, budget)
        started = time.monotonic()
        session = Session(name, slo, out / "tune", server_cpus, client_cpus, progress=log.info)
        ranked = session.ranked()
        with session:
            results = session.search(ranked, budget - (time.monotonic() - started))
        winner = tune.best(results)
        seconds = time.monotonic() - started
        if winner is None:
            entries.append(Entry(name, OURS, seconds, len(results), "nothing within the SLO", 0))
        else:
            picks[OURS] = winner.candidate
            pick = tune.label(winner.candidate)
            entries.append(Entry(name, OURS, seconds, len(results), pick, winner.throughput))
    log.info("%s: the picks again, alternately, %d rounds", name, rounds)
    with Session(name, slo, out / "remeasure", server_cpus, client_cpus) as session:
        for r in range(rounds):
            order = list(picks)[r % len(picks) :] + list(picks)[: r % len(picks)]
            for tool in order:
                verified = session.verify(picks[tool])
                entry = next(e for e in entries if e.tool == tool)
                entry.remeasured.append(verified.throughput)
                log.info("  round %d %s: %.1f/s", r + 1, tool, verified.throughput)
    return entries


def verdict(entries: list[Entry]) -> str:
    """Which search a target keeps: Model Analyzer's where it is within 3 % in no more time.

    ``bench tune`` gets Model Analyzer quick's time as its budget. Where the budget stopped it
    (the next verification would not fit), it would have searched on: its time is the budget.
    Where it verified all it planned sooner, its time is what it took.
    """
    ours = next((e for e in entries if e.tool == OURS), None)
    if ours is None:
        return "Model Analyzer (bench tune has no search for it)"
    _, spent, _ = time_of_ours(entries, ours)
    for entry in entries:
        if entry.tool in (OURS, SERVED) or entry.median is None or not ours.median:
            continue
        if entry.median >= 0.97 * ours.median and entry.seconds <= spent:
            return entry.tool
    return OURS


def time_of_ours(entries: list[Entry], ours: Entry) -> tuple[float, float, bool]:
    """Bench tune's budget, the time it counts as spent, and whether the budget stopped it."""
    quick = next((e for e in entries if e.tool == f"{MODEL_ANALYZER} quick"), None)
    budget = quick.seconds if quick else ours.seconds
    stopped = budget - ours.seconds < ours.seconds / max(1, ours.configs)
    return budget, budget if stopped else ours.seconds, stopped


def write_report(out: Path, entries: list[Entry], rounds: int) -> Path:
    """``report.md`` and ``compare.png``: the table, and the re-measured throughputs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [
        "# Model Analyzer and bench tune, side by side",
        "",
        f"Every pick measured again by bench tune's harness, {rounds} rounds, alternately.",
        "",
        "| target | p99 SLO | tool | pick | search s | configs | own /s | re-measured /s | "
        "median | ÷ bench tune |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    targets = list(dict.fromkeys(e.target for e in entries))
    notes: list[str] = []
    for name in targets:
        rows = [e for e in entries if e.target == name]
        ours = next((e for e in rows if e.tool == OURS), None)
        for e in rows:
            ratio = (
                f"{e.median / ours.median:.2f}x"
                if e.median is not None and ours and ours.median
                else "–"
            )
            again = ", ".join(f"{t:.1f}" for t in e.remeasured) or "–"
            median = f"{e.median:.1f}" if e.median is not None else "–"
            own = f"{e.own_throughput:.1f}" if e.tool != SERVED else "–"
            lines.append(
                f"| {name} | {SLO_MS[name]:g} ms | {e.tool} | {e.pick} | {e.seconds:.0f} | "
                f"{e.configs or '–'} | {own} | {again} | {median} | {ratio} |"
            )
        lines.append(f"| {name} | | **keeps** | **{verdict(rows)}** | | | | | | |")
        if ours is not None:
            budget, _, stopped = time_of_ours(rows, ours)
            how = "the budget stopped it" if stopped else "it verified all it planned"
            notes.append(f"- {name}: bench tune had {budget:.0f} s; {how} in {ours.seconds:.0f} s.")
    lines += ["", *notes]
    # One panel per target: their throughputs differ by a factor of a few.
    tools = list(dict.fromkeys(e.tool for e in entries))
    fig, axes = plt.subplots(1, len(targets), figsize=(3.2 * len(targets), 4), squeeze=False)
    for ax, name in zip(axes[0], targets, strict=True):
        rows = [e for e in entries if e.target == name and e.median is not None]
        xs = range(len(rows))
        colors = [f"C{tools.index(e.tool)}" for e in rows]  # one color per tool throughout
        ax.bar(xs, [e.median for e in rows], color=colors, alpha=0.6)
        for x, e in zip(xs, rows, strict=True):  # each round, beside the median
            ax.plot([x] * len(e.remeasured), e.remeasured, "k.")
        short = [e.tool.replace("Model Analyzer", "MA") for e in rows]
        ax.set_xticks(list(xs), short, fontsize=8, rotation=30, ha="right")
        ax.set_title(f"{name}, p99 ≤ {SLO_MS[name]:g} ms")
    axes[0][0].set_ylabel("re-measured throughput within the SLO (/s)")
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=100)
    plt.close(fig)
    lines += ["", "![re-measured throughput of each pick](compare.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    """Both tools on every target named; the report."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m bench.tune_compare classifier encoder classify shared",
    )
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"{', '.join(SLO_MS)} (all)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="default results/tune-compare-<time>")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="measure nothing: one report of earlier runs' compare.json (same --rounds)",
    )
    args = parser.parse_args(argv)
    if unknown := set(args.targets) - set(SLO_MS):
        parser.error(f"no target {', '.join(sorted(unknown))}: they are {', '.join(SLO_MS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    out = args.out or Path("results") / time.strftime("tune-compare-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cores = split_cores(sorted(os.sched_getaffinity(0)))
    entries: list[Entry] = []
    for folder in args.merge or ():
        entries += [Entry(**e) for e in json.loads((folder / "compare.json").read_text())]
    if args.merge:
        (out / "compare.json").write_text(json.dumps([asdict(e) for e in entries], indent=2))
        write_report(out, entries, args.rounds)
    for name in [] if args.merge else args.targets or list(SLO_MS):
        entries += run_target(name, args.rounds, out / name, cores)
        (out / "compare.json").write_text(json.dumps([asdict(e) for e in entries], indent=2))
        write_report(out, entries, args.rounds)
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
