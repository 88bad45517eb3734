"""The SLO tuner against a real server: raw curves, candidates served in turn, perf_analyzer.

``tune.search`` holds the search (candidates, the queueing model, verification by doubling
concurrency); a ``Session`` gives it a server to load candidates into and perf_analyzer to
measure them with, and writes the winner; ``python -m tune`` runs one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.harness import inputs, perf_analyzer
from bench.harness.plan import ONNX, Plan
from bench.harness.servers import TritonUnderTest, measure_raw, server_config
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding
from tune import search

Progress = Callable[[str], None]

# Whose search tunes each target: Triton Model Analyzer's quick search where it found as much
# in no more time, the tuner's own where it did not (docs/performance.md, "Model Analyzer side
# by side", where the two searches were compared on every target).
OURS, MODEL_ANALYZER = "the tuner", "Model Analyzer"
SEARCH = dict.fromkeys(search.TARGETS, OURS) | {
    classification.CLASSIFIER: MODEL_ANALYZER,
    embedding.ENCODER: MODEL_ANALYZER,
}


class Session:
    """One target tuned against one server (a fresh one per candidate served).

    Args:
        model: the target (``search.RAW_KIND``).
        p99_ms: the SLO.
        out: where the server logs, the inputs and the results go.
        server_cpus: the server's cores.
        client_cpus: perf_analyzer's cores.
        config_name: the variant the tuned configs are written as (and served with, where the
            base configs do not run the tuned steps).
        progress: where progress lines go.
    """

    def __init__(
        self,
        model: str,
        p99_ms: float,
        out: Path,
        server_cpus: Sequence[int],
        client_cpus: Sequence[int],
        config_name: str = "local-tuned",
        progress: Progress = print,
    ):
        if model not in search.TARGETS:
            raise ValueError(f"can tune {', '.join(search.TARGETS)}, not {model!r}")
        if not p99_ms > 0:
            raise ValueError(f"the p99 SLO must be a number of milliseconds > 0, not {p99_ms}")
        self.model, self.p99_ms, self.out = model, p99_ms, out
        self.server_cpus, self.client_cpus = list(server_cpus), list(client_cpus)
        self.config_name, self.progress = config_name, progress
        self.cores = len(self.server_cpus)
        self.triton: TritonUnderTest | None = None
        self.base: str | None = None
        self.data: dict[str, Path] = {}

    # Raw curves and candidates -------------------------------------------------------------
    def space(self) -> list[search.Candidate]:
        """The whole search space for the server's cores."""
        return search.candidates(max_batch=32, max_instances=max(2, self.cores))

    def ranked(self) -> dict[str, list[search.Prediction]]:
        """Raw curves for every thread budget of the space; each model's feasible candidates.

        For one target, its own; for the shared server, each model's as if it were alone.
        """
        kinds = {m: search.RAW_KIND[m] for m in self.measured()}
        plan = Plan.short()
        plan.raw_model_batches = plan.raw_pipeline_batches = list(search.BATCHES)
        plan.raw_embed_batches = list(search.BATCHES)
        plan.raw_seconds = 1.0
        encoders = any(kind.startswith("embed") for kind in kinds.values())
        raw: dict[str, dict[int, dict[int, float]]] = {m: {} for m in kinds}
        for threads in sorted({search.threads_for(c, self.cores) for c in self.space()}):
            curves = measure_raw(self.server_cpus, threads, plan, encoders=encoders)
            for model, kind in kinds.items():
                raw[model][threads] = curves[kind]
                self.progress(
                    f"raw {kind} curve, {threads} thread(s): "
                    + ", ".join(f"b{b}: {v:.0f}/s" for b, v in curves[kind].items())
                )
        ranked = {m: search.rank(self.space(), raw[m], self.cores, self.p99_ms) for m in kinds}
        for model, predictions in ranked.items():
            self.progress(
                f"{model}: {len(self.space())} candidates, {len(predictions)} predicted to meet "
                f"p99 <= {self.p99_ms} ms"
            )
        return ranked

    # The server ------------------------------------------------------------------------------
    def __enter__(self) -> Session:
        from bench.harness.reference import ReferenceClassifier

        self.out.mkdir(parents=True, exist_ok=True)
        reference = ReferenceClassifier(ONNX)
        self.data = {m: inputs.write(m, self.out, reference) for m in self.measured()}
        config = server_config(self.server_cpus)
        self.triton = TritonUnderTest(config, self.out).start()
        self.base = self.triton.server.config.model_config_name
        if self.model in search.RAW_KIND and not search.serves_tuned_steps(
            self.model, MODEL_REPOSITORY, self.base
        ):
            # Measure the candidates as the written configs will serve them (the tuned steps
            # in the ensemble), with the base configs still the ones the overlays start from.
            self.progress(
                f"{self.model} on configs {self.base} does not run "
                f"{search.tuned_models(self.model)}: measuring with "
                f"--model-config-name={self.config_name} instead"
            )
            self.triton.close()
            self.triton.config = dataclasses.replace(config, model_config_name=self.config_name)
            self.triton.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.triton is not None:
            self.triton.close()

    def load(self, pick: search.Candidate | search.Pick) -> None:
        """Serve a candidate (or one per step) in a fresh server, the computed path (no cache).

        perf_analyzer repeats its inputs, which embed's response cache would answer.
        """
        self.triton.configure(search.variant_for(pick, self.model, self.cores), cache=False)

    def measured(self) -> tuple[str, ...]:
        """The models perf_analyzer loads: the target, or both of a shared server's at once."""
        return search.tuned_models(search.SHARED) if self.model == search.SHARED else (self.model,)

    def measure(self, level: int) -> perf_analyzer.Point:
        """One concurrency level; an unmeasurable one counts as an SLO break.

        A shared server is loaded at ``level`` on each of its models at once (one perf_analyzer
        each, in parallel): their throughputs add up, the worst p99 is the one the SLO holds.
        """
        models = self.measured()
        with ThreadPoolExecutor(len(models)) as pool:
            points = list(pool.map(lambda m: self._measure_one(m, level), models))
        if len(points) == 1:
            return points[0]
        return perf_analyzer.Point(
            level,
            sum(p.throughput for p in points),
            *(max(getattr(p, f) for p in points) for f in perf_analyzer.LATENCIES),
        )

    def _measure_one(self, model: str, level: int) -> perf_analyzer.Point:
        # Short windows: the tuner measures many levels; ranking needs less precision.
        run = perf_analyzer.Run(
            model,
            self.triton.url("grpc"),
            "grpc",
            input_data=self.data[model],
            measurement_ms=1000,
            cpus=self.client_cpus,
            extra=search.perf_analyzer_flags(model),
        )
        try:
            return perf_analyzer.measure(run, level)
        except perf_analyzer.PerfAnalyzerError:
            return perf_analyzer.Point(level, 0, *([float("inf")] * 5), 0, 0)

    # What the tuner does ---------------------------------------------------------------------
    def search(
        self, ranked: dict[str, list[search.Prediction]], budget_s: float
    ) -> list[search.Verified]:
        """Verify the ranked candidates within the budget.

        One target: ``tune.search.search``. The shared server: its models' best shapes, paired
        (``tune.search.shared_picks``), both loaded at once.
        """
        if self.model != search.SHARED:
            predictions = ranked[self.model]
            return search.search(
                predictions, self.load, self.measure, self.p99_ms, budget_s, self.progress
            )
        picks = search.shared_picks(ranked)
        return search.search_picks(
            picks, self.load, self.measure, self.p99_ms, budget_s, self.progress
        )

    def verify(self, pick: search.Candidate | search.Pick) -> search.Verified:
        """The best throughput within the SLO of one candidate, by the same harness."""
        return search.verify(pick, self.load, self.measure, self.p99_ms)

    def write(self, pick: search.Candidate | search.Pick, header: str) -> list[Path]:
        """Write a pick as the ``config_name`` overlays of its steps, rendered."""
        variant = search.variant_for(pick, self.model, self.cores)
        return search.write_configs(variant, MODEL_REPOSITORY, self.base, self.config_name, header)


def write_report(
    out: Path,
    title: str,
    rows: Sequence[tuple[str, search.Verified]],
    p99_ms: float,
    notes: Sequence[str] = (),
) -> Path:
    """Write ``report.md`` and ``tune.png`` into ``out``; the report's path.

    Every verified pick in the order measured: its throughput within the SLO and its p99 there.

    Args:
        out: the results folder.
        title: the report's heading.
        rows: (who measured it, the verified pick) in order.
        p99_ms: the SLO.
        notes: lines above the table (what ran, how long it took).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [f"# {title}", "", *notes, ""] if notes else [f"# {title}", ""]
    lines += [
        f"| # | by | config | items/s within p99 ≤ {p99_ms:g} ms | p99 ms | c | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (who, r) in enumerate(rows, 1):
        p99 = f"{r.p99_ms:.1f}" if r.throughput else "–"
        lines.append(
            f"| {i} | {who} | {search.label(r.candidate)} | {r.throughput:.1f} | {p99} | "
            f"{r.concurrency} | {r.seconds:.0f} |"
        )
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows) + 2), 4))
    colors = {who: f"C{i}" for i, who in enumerate(dict.fromkeys(w for w, _ in rows))}
    for i, (who, r) in enumerate(rows, 1):
        ax.bar(i, r.throughput, color=colors[who], label=who)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(dict(zip(labels, handles, strict=True)).values(), dict.fromkeys(labels))
    ax.set_xlabel("verified pick (the table's #)")
    ax.set_ylabel(f"throughput within p99 ≤ {p99_ms:g} ms (/s)")
    ax.set_title(title)
    fig.tight_layout()
    plot = out / "tune.png"
    fig.savefig(plot, dpi=100)
    plt.close(fig)
    lines += ["", f"![throughput of each verified pick]({plot.name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def with_model_analyzer(session: Session, started: float, budget_s: float) -> int:
    """Tune ``session``'s target with Model Analyzer's quick search; write and report its pick.

    Its pick is measured again by this harness beside the configs served now (for the report),
    then written as ``session.config_name`` the way the tuner writes its own.
    """
    from tune import model_analyzer

    target = model_analyzer.target(session.model)
    folder = session.out / "model-analyzer"
    outcome = model_analyzer.run(
        target,
        "quick",
        session.p99_ms,
        folder,
        session.server_cpus,
        session.client_cpus,
        progress=session.progress,
    )
    seconds = time.monotonic() - started
    if seconds > budget_s:
        session.progress(f"Model Analyzer took {seconds:.0f} s, over the {budget_s:.0f} s budget")
    if outcome.best is None:
        session.progress(
            f"Model Analyzer found no config within p99 <= {session.p99_ms} ms "
            f"(exit {outcome.returncode}; {folder / 'model-analyzer.log'}); nothing written"
        )
        return 1
    pick = model_analyzer.pick(folder, outcome.best, target)
    session.progress(
        f"Model Analyzer's pick: {search.label(pick)} ({outcome.configs} configs, "
        f"{outcome.measurements} measurements, {outcome.seconds:.0f} s); measuring it again"
    )
    with session:
        rows = [("Model Analyzer", session.verify(pick)), ("served now", session.verify({}))]
        header = (
            f"Written by `python -m tune {session.model} --p99-ms {session.p99_ms:g}` "
            f"with Triton Model Analyzer's quick search; what it measured: {folder / 'export'}."
        )
        for path in session.write(pick, header):
            session.progress(search.describe(path))
    notes = [
        f"Triton Model Analyzer {model_analyzer.VERSION}, quick search: {outcome.configs} configs, "
        f"{outcome.measurements} measurements, {outcome.seconds:.0f} s; its own number for its "
        f"pick: {model_analyzer.number(outcome.best[model_analyzer.THROUGHPUT]):.1f}/s."
    ]
    title = f"SLO tuner: {session.model}"
    report = write_report(session.out, title, rows, session.p99_ms, notes)
    session.progress(f"report: {report}")
    return 0
