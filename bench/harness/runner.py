"""Runs a plan: rounds of interleaved, pinned measurements, one row per case and round."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import affinity, inputs, perf_analyzer, stats, trace, variants
from bench.harness.plan import (
    EMBED,
    EMBED_MODELS,
    ENCODERS,
    MODELS,
    ONNX,
    RATE_STABILITY_PERCENT,
    RATE_WINDOW_REQUESTS,
    STATS_MODELS,
    TEXT_MODELS,
    Case,
    Plan,
    perf_args,
)
from bench.harness.servers import (
    REFERENCE_BATCHES,
    REFERENCED,
    RawReference,
    TritonUnderTest,
    cpu_per_item,
    measure_raw,
    measure_stages,
    peer_token_counts,
    process_cpu,
    server_config,
)
from bench.peers import infinity
from export import text_samples
from pipelines import classification, embedding


def _token_counter(
    case: Case, triton: TritonUnderTest | None, url: str
) -> Callable[[], tuple[float, float]] | None:
    """How to read the real and padded tokens of the server a case measures, if it counts them."""
    if case.model not in EMBED_MODELS or case.dataset == "repeated":
        return None
    if case.system == "triton" and triton is not None:
        return lambda: triton.token_counts(case.model)
    if case.system == "peer":
        return lambda: peer_token_counts(url, case.model)
    return None  # infinity-emb's /metrics has HTTP request metrics only; the null peers run none


# A raw reading at most this old, with no case measured since, is the next case's reading before
# it: between two consecutive cases, the one after the first is also the one before the second.
READING_REUSE_S = 2.0


@dataclass
class Row:
    """One measured case in one round, with what the statistics API saw meanwhile."""

    round: int
    case: Case
    point: perf_analyzer.Point | None
    error: str = ""
    deltas: dict[str, stats.ModelDelta] = field(default_factory=dict)
    # (real, padded) token positions the embedding server ran meanwhile, where it counts them.
    tokens: tuple[float, float] | None = None
    # When perf_analyzer ran (time.monotonic_ns, the clock of Triton's trace).
    window: tuple[int, int] | None = None
    # CPU milliseconds per inference of the case's model, by process (tritonserver, each step's
    # stub), over the case: what each image cost the server's cores.
    cpu: dict[str, float] | None = None
    # The raw pipeline's stages (ms per image) timed just "before" and "after" a traced case at
    # concurrency 1: its reference, measured as close to it as they can be.
    stages: dict[str, dict[str, float]] | None = None
    # The raw pipeline's images/s per batch size, read just before and just after the case
    # (RawReference), averaged: what its ratios to the raw pipeline are taken against.
    reference: dict[int, float] | None = None

    def flat(self) -> dict:
        """One CSV line."""
        out = {"round": self.round, **dataclasses.asdict(self.case)}
        point = dataclasses.asdict(self.point) if self.point else {}
        for name in perf_analyzer.Point.__dataclass_fields__:
            if name != "level":
                out[name] = point.get(name, "")
        for model in STATS_MODELS:
            d = self.deltas.get(model)
            out[f"{model}_avg_batch"] = round(d.avg_batch, 3) if d else ""
            out[f"{model}_request_ms"] = round(d.request_ms, 4) if d else ""
        classifier = self.deltas.get(classification.CLASSIFIER)
        out["classifier_batch_histogram"] = (
            json.dumps(classifier.batch_histogram) if classifier else ""
        )
        ensemble = self.deltas.get(self.case.model)
        out["cache_hits"] = ensemble.cache_hits if ensemble else ""
        out["tokens"], out["padded_tokens"] = self.tokens or ("", "")
        out["window_start_ns"], out["window_end_ns"] = self.window or ("", "")
        out["cpu_ms_per_item"] = json.dumps(self.cpu) if self.cpu else ""
        out["raw_stage_ms"] = json.dumps(self.stages) if self.stages else ""
        out["raw_reference"] = json.dumps(self.reference) if self.reference else ""
        out["error"] = self.error
        return out


class Runner:
    """Runs a plan and collects rows; progress goes to ``progress`` (one line per level)."""

    def __init__(
        self,
        plan: Plan,
        out_dir: Path,
        server_cpus: list[int],
        client_cpus: list[int],
        progress: Callable[[str], None] = print,
        infinity_venv: Path | None = None,
    ):
        self.plan = plan
        self.infinity_venv = infinity.venv_dir(infinity_venv)
        # Lines for the report's method section: pinning read back, infinity's set-up.
        self.notes: list[str] = []
        self._infinity_checked = False
        self._infinity_failure: str | None = None
        self.out_dir = out_dir
        self.server_cpus = server_cpus
        self.client_cpus = client_cpus
        self.progress = progress
        self.rows: list[Row] = []
        self.raw: list[dict] = []
        self.mixed_data: dict[str, Path] = {}  # payload -> the mixed-length inputs (``run``)
        self.done = 0
        self.restarts = 0  # times the server died and was started again
        self.triton: TritonUnderTest | None = None  # the server being measured, while running
        self.reference: RawReference | None = None  # the raw pipeline on request, while running
        self._last_reading: tuple[float, dict[int, float]] | None = None  # (monotonic s, reading)
        self.total = plan.size() * plan.rounds
        self.started = time.monotonic()

    def _tick(self, row: Row) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        if row.point:
            p = row.point
            result = f"{p.throughput:8.1f} infer/s  p50 {p.p50_ms:6.2f} ms  p99 {p.p99_ms:6.2f} ms"
        else:
            result = f"FAILED: {row.error.splitlines()[0] if row.error else '?'}"
        self.progress(
            f"[{self.done:3d}/{self.total}, ETA {eta / 60:4.1f} min] r{row.round} "
            f"{row.case.label():55s} {result}"
        )

    def _measure(
        self,
        round_: int,
        case: Case,
        data: Path,
        triton: TritonUnderTest | None = None,
        url: str = "",
    ) -> Row:
        """One case against ``triton`` (or a peer at ``url``); a failure is recorded, not raised."""
        if triton is not None:
            self._revive(triton)
            url = triton.url(case.protocol)
        run = perf_analyzer.Run(
            model=case.model,
            url=url,
            protocol=case.protocol,
            mode=case.mode,
            input_data=data,
            measurement_ms=self.plan.measurement_ms,
            stability_percent=self.plan.stability_percent,
            tensor_format=case.payload,
            cpus=self.client_cpus,
            extra=perf_args(case),
        )
        if case.dataset == "mixed":
            run.stability_percent = RATE_STABILITY_PERCENT
        if case.mode == "rate":
            count = max(RATE_WINDOW_REQUESTS, int(case.level * self.plan.measurement_ms / 1000))
            run.stability_percent = RATE_STABILITY_PERCENT
            run.extra = ["--measurement-mode=count_windows", f"--measurement-request-count={count}"]
        point, error, deltas, tokens, window, cpu = None, "", {}, None, None, None
        counts = _token_counter(case, triton, url)
        readings = []
        referenced = self.reference is not None and case.model in REFERENCED
        referenced = referenced and case.dataset == "samples" and case.system != "null-peer"
        last, self._last_reading = self._last_reading, None
        try:
            if referenced:
                fresh = last and time.monotonic() - last[0] <= READING_REUSE_S
                readings.append(last[1] if fresh else self.reference.measure())
            before = triton.statistics() if triton else None
            tokens_before = counts() if counts else None
            cpu_before = process_cpu(triton.server.process.pid) if triton else {}
            started = time.monotonic_ns()
            # The server watched while it is measured: a hang costs watch()'s wait, not the
            # case's timeout.
            watch = triton.watch if triton is not None else None
            point = perf_analyzer.measure(
                run, case.level, timeout=self.plan.case_timeout_s, watch=watch
            )
            window = (started, time.monotonic_ns())
            if triton:
                cpu_after = process_cpu(triton.server.process.pid)
                deltas = stats.delta(before, triton.statistics())
                done = deltas.get(case.model)
                cpu = cpu_per_item(cpu_before, cpu_after, done.inferences if done else 0)
            if counts:
                tokens = tuple(b - a for a, b in zip(tokens_before, counts(), strict=True))
            if referenced:
                readings.append(self.reference.measure())
                self._last_reading = (time.monotonic(), readings[-1])
        except Exception as exc:  # noqa: BLE001 - one case must never end the run
            error = f"{type(exc).__name__}: {exc}"
            trouble = triton.trouble() if triton is not None else None
            if trouble:
                error = f"{trouble}\n{error}"
        row = Row(round_, case, point, error, deltas, tokens, window, cpu)
        if len(readings) == 2:
            row.reference = {b: sum(r[b] for r in readings) / 2 for b in REFERENCE_BATCHES}
        return self._record(row)

    def _record(self, row: Row) -> Row:
        self.rows.append(row)
        self._tick(row)
        return row

    def run(self) -> None:
        """All rounds: raw, every variant (rotated order), rate sweep, peer, null peer."""
        data_dir = self.out_dir / "inputs"
        data_dir.mkdir(parents=True, exist_ok=True)
        from bench.harness.reference import ReferenceClassifier

        reference = ReferenceClassifier(ONNX)
        data = {m: inputs.write(m, data_dir, reference) for m in MODELS + TEXT_MODELS}
        json_data = {
            classification.CLASSIFIER: inputs.write(
                classification.CLASSIFIER, data_dir, as_json=True
            ),
            # Texts: one file for both formats.
            **{m: data[m] for m in TEXT_MODELS},
        }
        repeated = inputs.write(embedding.ENSEMBLE, data_dir, repeated=True)
        openai_data = inputs.write(embedding.ENSEMBLE, data_dir, openai=True)
        self.mixed_data = {
            "json": inputs.write(EMBED, data_dir, mixed=True),
            "openai": inputs.write(EMBED, data_dir, mixed=True, openai=True),
        }
        threads = len(self.server_cpus)
        with contextlib.ExitStack() as stack:
            triton = stack.enter_context(
                TritonUnderTest(server_config(self.server_cpus), self.out_dir)
            )
            if self.plan.raw and any(m in REFERENCED for m, _, _ in self.plan.main):
                self.reference = RawReference(self.server_cpus)
                stack.callback(self.reference.close)
            self.triton = triton
            for r in range(1, self.plan.rounds + 1):
                self._round(r, triton, data, json_data, repeated, openai_data, threads)
            self.restarts = triton.deaths

    def _round(self, r, triton, data, json_data, repeated, openai_data, threads) -> None:
        """One round: raw engine, every variant (rotated), rate sweep, traced cases, peers."""
        all_variants = variants.standard(threads)
        # Other work on the machine shows here (every core counts, ours included).
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        self.notes.append(f"round {r}: load average (1, 5, 15 min) at its start: {load}")
        if self.plan.raw:
            self.progress(f"round {r}: raw engine on cores {self.server_cpus}, {threads} thread(s)")
            self.raw.append(measure_raw(self.server_cpus, threads, self.plan))
            self.progress(f"  raw: {self.raw[-1]}")
        else:
            self.raw.append({})
        shift = (r - 1) % len(all_variants)
        for variant in all_variants[shift:] + all_variants[:shift]:
            if variant.name == variants.SERVED:
                self._served(r, triton, variant, data, json_data, repeated)
            elif any(self.plan.triton_cases(variant.name)):  # else nothing to measure: no reload
                self._configure(triton, variant, None)
                self._variant_cases(r, triton, variant, data, json_data)
        peer_data = {
            m: {"json": json_data.get(m), "binary": data[m]} for m in self.plan.peer_levels
        }
        self._peers(r, peer_data, threads)
        if self.plan.infinity_levels or self.plan.mixed_levels:
            self._infinity(r, openai_data)

    def _variant_cases(self, r, triton, variant, data, json_data) -> None:
        """The plan's concurrency cases of one variant, already loaded."""
        for case in self.plan.triton_cases(variant.name):
            # Never without a file: perf_analyzer would make up random inputs.
            source = (json_data if case.payload == "json" else data)[case.model]
            if case.dataset == "mixed":
                source = self.mixed_data[case.payload]
            self._measure(r, case, source, triton)

    def _served(self, r, triton, variant, data, json_data, repeated) -> None:
        """The repository's own configs: its cases, rate sweep, traced cases, then cached rows."""
        # Embed's computed path first (perf_analyzer repeats its inputs, which the response
        # cache would answer); the other variants measure classify only.
        self._configure(triton, variant, cache=False)
        if triton.running():
            self._pin(r, "tritonserver and its stubs", triton.server.process.pid)
        self._variant_cases(r, triton, variant, data, json_data)
        self._rate_sweep(r, data, triton)
        self._traced(r, data, triton)
        if not self.plan.cache_levels:
            return
        self._configure(triton, variant, cache=True)
        for case in self.plan.cache_cases():
            self._measure(r, case, repeated, triton)

    def _traced(self, round_: int, data: dict[str, Path], triton: TritonUnderTest) -> None:
        """The plan's traced cases: every request of the model traced while perf_analyzer runs.

        At concurrency 1 the raw pipeline's stages are timed on the server's cores right before
        and after (the server idle) and kept with the row: the reference its per-step times are
        read against, measured seconds from them rather than minutes as the round's raw curves.
        """
        for case in self.plan.traced_cases():
            model = case.model
            stages: list[dict[str, float]] = []
            try:
                self._revive(triton)
                if case.level == 1:
                    stages.append(measure_stages(self.server_cpus, self.plan.raw_seconds))
                trace.set_tracing(triton.client, model, True, triton.server.admin_headers())
            except Exception as exc:  # noqa: BLE001 - its row says why; the run goes on
                self._record(Row(round_, case, None, f"tracing not set up: {exc}"))
                continue
            try:
                row = self._measure(round_, case, data[model], triton)
            finally:
                with contextlib.suppress(Exception):  # a dead server traces nothing anyway
                    trace.set_tracing(triton.client, model, False, triton.server.admin_headers())
            if stages and row.point:
                try:
                    stages.append(measure_stages(self.server_cpus, self.plan.raw_seconds))
                except Exception as exc:  # noqa: BLE001 - the one before still stands
                    self.progress(f"  raw stages after the traced case failed: {exc}")
                row.stages = dict(zip(("before", "after"), stages, strict=False))

    def _pin(self, round_: int, name: str, pid: int) -> None:
        """Pin every thread of a server (and its children) to the server's cores; note it."""
        try:
            line = affinity.pin_and_report(name, pid, self.server_cpus)
        except Exception as exc:  # noqa: BLE001 - a missing taskset costs the note only
            line = f"{name}: pinning failed: {type(exc).__name__}: {exc}"
        self.notes.append(f"round {round_}: {line}")
        self.progress(f"  {line}")

    def _infinity(self, round_: int, data: Path) -> None:
        """infinity-emb at the plan's levels, then its null twin (the load generator's ceiling).

        If it cannot be installed or started, its rows and a note say why; the run goes on.
        """
        cases = self.plan.infinity_cases()
        server = None
        if self._infinity_failure is None:
            self.progress(f"  infinity-emb {infinity.VERSION} from {self.infinity_venv}")
            try:
                server = infinity.start(self.infinity_venv, self.server_cpus, self.out_dir)
            except infinity.InfinityUnavailableError as exc:
                self._infinity_failure = str(exc)
                self.notes.append(f"infinity-emb not measured: {exc}")
                self.progress(f"  infinity-emb not measured: {exc}")
        if server is None:
            for case in cases:
                self._record(Row(round_, case, None, f"infinity-emb: {self._infinity_failure}"))
        else:
            try:
                self._pin(round_, "infinity", server.process.pid)
                if not self._infinity_checked:
                    self._check_infinity(server)
                for case in cases:
                    source = self.mixed_data["openai"] if case.dataset == "mixed" else data
                    self._measure(round_, case, source, url=server.url)
            finally:
                server.stop()
        null_cases = self.plan.openai_null_cases()
        null = infinity.NullOpenAIServer(cpus=self.server_cpus)
        with self._started(round_, null, null_cases, "null OpenAI server") as started:
            for case in null_cases if started else []:
                self._measure(round_, case, data, url=null.url)

    @contextlib.contextmanager
    def _started(self, round_: int, server, cases: list[Case], what: str) -> Iterator[bool]:
        """``server`` running for ``cases`` (True), stopped after; else their rows say why."""
        try:
            server.start()
        except Exception as exc:  # noqa: BLE001 - its rows say why; the run goes on
            for case in cases:
                self._record(Row(round_, case, None, f"{what} did not start: {exc}"))
            yield False
            return
        try:
            yield True
        finally:
            server.stop()

    def _check_infinity(self, server: infinity.InfinityServer) -> None:
        """Once per run: its vectors against the project's PyTorch reference; note the set-up."""
        self._infinity_checked = True
        texts = [*text_samples.SENTENCES[:4], text_samples.SENTENCES[-1]]
        try:
            cosine = infinity.check_vectors(server, texts)
            verdict = "ok" if cosine >= infinity.MIN_COSINE else "MISMATCH"
            check = f"min cosine {cosine:.6f} over {len(texts)} sentences ({verdict})"
        except Exception as exc:  # noqa: BLE001 - the note says the check could not run
            check = f"could not be checked: {type(exc).__name__}: {exc}"
        line = (
            f"infinity-emb {infinity.VERSION}: engine {infinity.ENGINE} (onnxruntime, CPU), "
            f"max batch {server.batch_size}, pooling {infinity.POOLING}; vectors vs the "
            f"PyTorch reference: {check}"
        )
        self.notes.append(line)
        self.progress(f"  {line}")

    def _configure(
        self, triton: TritonUnderTest, variant: variants.Variant, cache: bool | None
    ) -> None:
        """Load ``variant`` (and embed's response cache setting); a failure is reported, not fatal.

        Cases measured after a failed load record their own errors (or measure what is loaded).
        """
        try:
            self._revive(triton)
            triton.configure(variant, cache)
        except Exception as exc:  # noqa: BLE001 - the cases after it say what it cost
            self.progress(f"  loading variant {variant.name} failed: {type(exc).__name__}: {exc}")

    def _revive(self, triton: TritonUnderTest) -> None:
        """Replace a server that died or hangs, with what it had; say so in the progress."""
        trouble = triton.trouble()
        if trouble:
            self.progress(f"  {trouble}; starting a new one")
            triton.restart()

    def _rate_sweep(self, round_: int, data: dict[str, Path], triton: TritonUnderTest) -> None:
        """Poisson arrivals at fractions of what concurrency reached in this round."""
        for model, protocol in self.plan.rate_targets:
            saturated = max(
                (
                    row.point.throughput
                    for row in self.rows
                    if row.round == round_
                    and row.point
                    and (row.case.system, row.case.variant, row.case.mode)
                    == ("triton", variants.SERVED, "concurrency")
                    and (row.case.model, row.case.protocol, row.case.payload)
                    == (model, protocol, "binary")
                ),
                default=0.0,
            )
            if not saturated:
                self.progress(f"  rate sweep skipped: no {model} {protocol} throughput this round")
                self.done += len(self.plan.rate_fractions)
                continue
            for fraction in self.plan.rate_fractions:
                level = max(1.0, round(fraction * saturated))
                case = Case("triton", variants.SERVED, model, protocol, "binary", "rate", level)
                self._measure(round_, case, data[model], triton)

    def _peers(self, round_: int, data: dict[str, dict[str, Path]], threads: int) -> None:
        """Each peer model, then its null twin (the load generator's ceiling), per payload."""
        from bench.peers.microbatcher import PeerServer

        for model, by_system in ((m, self.plan.peer_cases(m)) for m in self.plan.peer_levels):
            # classify runs the classifier's model.onnx behind its own decode and top-k.
            onnx_path = ENCODERS[EMBED] if model == EMBED else ONNX
            for system, path in (("peer", onnx_path), ("null-peer", None)):
                cases = by_system[system]
                if not cases:
                    continue
                peer = PeerServer(
                    path, cpus=self.server_cpus, intra_op_threads=threads, model_name=model
                )
                with self._started(round_, peer, cases, "peer") as started:
                    if started and system == "peer":
                        self._pin(round_, f"FastAPI peer ({model})", peer.process.pid)
                    for case in cases if started else []:
                        source = data[model][case.payload]
                        if case.dataset == "mixed":
                            source = self.mixed_data[case.payload]
                        self._measure(round_, case, source, url=peer.url)

    def write_csv(self) -> tuple[Path, Path]:
        """points.csv (one line per measured case and round) and raw.csv."""
        lines = [row.flat() for row in self.rows]
        return write_csv(self.out_dir, lines, dict(enumerate(self.raw, 1)))


def write_csv(
    folder: Path, lines: list[dict], raw: Mapping[int, Mapping[str, Mapping[int, float]]]
) -> tuple[Path, Path]:
    """Write points.csv (one line per measured case and round) and raw.csv.

    ``bench.report.points.load`` reads them back.

    Args:
        folder: where both go.
        lines: the cases' flat rows, each with the same fields.
        raw: round → kind → batch size → throughput of the raw engine.
    """
    points = folder / "points.csv"
    with open(points, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)
    raw_csv = folder / "raw.csv"
    with open(raw_csv, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["round", "kind", "batch_size", "throughput"])
        for r, result in raw.items():
            for kind, curve in result.items():
                writer.writerows([r, kind, bs, f"{value:.3f}"] for bs, value in curve.items())
    return points, raw_csv
