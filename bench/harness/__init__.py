"""The benchmark run behind ``make perf``: rounds of interleaved, pinned measurements.

Every round measures, on the same machine within minutes of each other: the raw engine
in-process, each serving variant of Triton (perf_analyzer, concurrency and Poisson-rate sweeps,
gRPC and HTTP), and the peer server driven by the same perf_analyzer with the same JSON payload.
Ratios are taken within a round, then summarized over rounds (median and spread), because CPU
speed here drifts by tens of percent from minute to minute.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import tritonclient.http as http

import model_config
from bench.harness import affinity, inputs, perf_analyzer, stats, trace, variants
from bench.harness.raw import STAGE_KIND
from bench.peers import infinity
from export import text_samples
from pipelines import classification as spec
from pipelines import embedding
from server import Server, ServerConfig
from server.launcher import MODEL_REPOSITORY
from server.process import stub_model

log = logging.getLogger(__name__)

ONNX = MODEL_REPOSITORY / spec.CLASSIFIER / "1" / "model.onnx"
# The image service's models: the ensemble, its steps, and the same pipeline in one step.
MODELS = (spec.ENSEMBLE, *variants.STEPS, spec.FUSED)
EMBED_MODELS = inputs.EMBED_MODELS
TEXT_MODELS = inputs.TEXT_MODELS
EMBED = embedding.ENSEMBLE
# The OpenAI client's ceiling (null server) at concurrency 1 only: at higher levels perf_analyzer
# 2.51's OpenAI client hung or did not stabilize against a server that answers in microseconds;
# at 1 it is a lower bound of the ceiling, still far above what infinity-emb reaches (figures:
# docs/performance.md, "Embeddings: infinity-emb beside embed and the FastAPI peer").
OPENAI_NULL_LEVELS = [1]
COUNT_WINDOWS = ["--measurement-mode=count_windows", "--measurement-request-count=5000"]
# Poisson arrivals at a fixed rate: windows of at least this many requests, judged with this
# stability, else a low rate never stabilizes in short windows (docs/performance.md, "A run that
# always completes").
RATE_WINDOW_REQUESTS = 150
RATE_STABILITY_PERCENT = 30.0
# Mixed-length texts: windows of at least this many requests (four times the concurrency where
# that is more), judged with the rate sweeps' stability. A server that pads passages into every
# batch answers a few texts per second, and a time window of a second then records none; a
# window of a few batches swings with the passages each happened to hold.
MIXED_WINDOW_REQUESTS = 64
# Traced (bench/harness/trace.py): the ensemble at 1 and at saturation, the one-step variant at 1.
TRACED = [(spec.ENSEMBLE, p, level) for p in ("grpc", "http") for level in (1, 16)] + [
    (spec.FUSED, p, 1) for p in ("grpc", "http")
]
# Models whose statistics points.csv has columns for (formed batches, time in the server); each
# server is asked about those it loads (``stats_models``): embed's steps depend on the configs.
STATS_MODELS = (
    *MODELS,
    embedding.ENSEMBLE,
    embedding.TOKENIZE,
    embedding.ENCODER,
    embedding.TOKENIZE_ENCODE,
    embedding.GRAPH_ENSEMBLE,
)
# The embed steps that count real and padded tokens (pipeline_*tokens_total): the one that pads.
PADDING_STEPS = (embedding.TOKENIZE_ENCODE, embedding.TOKENIZE)


def ensemble_steps(model: str, config_name: str | None) -> list[tuple[str, int]]:
    """(step model, version) of an ensemble as the server renders it for ``config_name``.

    Version -1 means the model's latest. On the CPU configs embed is one step,
    tokenize_encode; on others it is tokenize, then encoder.
    """
    config = model_config.resolve(MODEL_REPOSITORY / model, config_name)
    return [(s.model_name, s.model_version) for s in config.ensemble_scheduling.step]


def stats_models(config_name: str | None) -> tuple[str, ...]:
    """The models of STATS_MODELS that a server with these configs loads."""
    steps = {name for m in EMBED_MODELS for name, _ in ensemble_steps(m, config_name)}
    embed_steps = (embedding.TOKENIZE, embedding.ENCODER, embedding.TOKENIZE_ENCODE)
    return tuple(m for m in STATS_MODELS if m not in embed_steps or m in steps)


def padding_step(model: str, config_name: str | None) -> tuple[str, str | None]:
    """(step, version label or None for all) whose token counters tell ``model``'s padding."""
    for name, version in ensemble_steps(model, config_name):
        if name in PADDING_STEPS:
            return name, str(version) if version > 0 else None
    raise LookupError(f"{model} has no step that counts tokens under configs {config_name!r}")


ENCODERS = {
    name: MODEL_REPOSITORY / embedding.ENCODER / version / "model.onnx"
    for name, version in zip(EMBED_MODELS, ("1", "2"), strict=True)
}


@dataclass(frozen=True)
class Case:
    """One thing to measure at one load level."""

    system: str  # triton | peer | null-peer | infinity
    variant: str  # Triton serving variant, "-" for the peers
    model: str
    protocol: str  # grpc | http
    payload: str  # binary | json | openai (an OpenAI-style /embeddings request body)
    mode: str  # concurrency | rate
    level: float
    # "samples": the short sentences; "repeated": one input over and over (response-cache
    # hits); "mixed": distinct sentences and passages (inputs.mixed_texts).
    dataset: str = "samples"
    calls: str = "sync"  # perf_analyzer's calls: sync, or async (its OpenAI client has no other)

    def label(self) -> str:
        """Short human-readable name."""
        unit = "c" if self.mode == "concurrency" else "rate"
        data = "" if self.dataset == "samples" else f" [{self.dataset}]"
        calls = "" if self.calls == "sync" else f" {self.calls}"
        return (
            f"{self.system}/{self.variant} {self.model} {self.protocol}-{self.payload} "
            f"{unit}={self.level:g}{data}{calls}"
        )


@dataclass
class Plan:
    """What a run measures. ``short()``: the default run, infinity-emb's rows included.

    Those add 12 load levels (2 of them mixed-length) and one infinity-emb start per round, and
    its installation on first use; ``full()`` is everything. How long each takes:
    docs/performance.md#how-long-a-run-takes.
    """

    rounds: int
    # (model, protocol, payload) -> concurrency levels, for the main "batching" variant.
    main: dict[tuple[str, str, str], list[int]]
    # variant name -> [(model, protocol, levels)]
    others: dict[str, list[tuple[str, str, list[int]]]]
    rate_fractions: list[float]  # of the saturated throughput in the same round
    rate_targets: list[tuple[str, str]]  # (model, protocol) with a Poisson request-rate sweep
    # peer model (classifier | embed) -> payload (binary | json) -> concurrency levels
    peer_levels: dict[str, dict[str, list[int]]]
    null_levels: list[int]
    null_payloads: tuple[str, ...]  # payloads whose load-generator ceiling is measured
    cache_levels: list[int]  # embed with one repeated text: the response-cache hit path
    raw_model_batches: list[int]
    raw_pipeline_batches: list[int]
    raw_embed_batches: list[int] = field(default_factory=lambda: [1, 8, 32])
    raw_seconds: float = 1.5
    measurement_ms: int = 1000
    # perf_analyzer's --stability-percentage for concurrency levels (rate levels use their own).
    stability_percent: float = 20.0
    # infinity-emb (bench/peers/infinity.py) at these concurrencies, with embed and the FastAPI peer
    # also driven with asynchronous calls at the same levels, for ratios in one calling mode.
    infinity_levels: list[int] = field(default_factory=list)
    raw: bool = True  # measure the raw engine each round
    # Mixed-length texts: embed, the FastAPI peer and infinity-emb at these concurrencies, all
    # with asynchronous calls (infinity's client has no other), and the raw engine over the
    # same texts at these batch sizes.
    mixed_levels: list[int] = field(default_factory=list)
    raw_mixed_batches: list[int] = field(default_factory=list)
    # A perf_analyzer run that has not finished by then is a hung server: the case fails.
    case_timeout_s: float = 300.0
    # (model, protocol, concurrency) measured again with Triton's trace on, for where each
    # request's time goes step by step (bench/harness/trace.py); at concurrency 1 the raw pipeline's
    # stages are timed right before and after, on the server's cores.
    traced: list[tuple[str, str, int]] = field(default_factory=list)
    # After the rounds: embed's per-text cache under Zipf traffic (bench/text_cache.py).
    text_cache: bool = False

    @classmethod
    def short(cls) -> Plan:
        """The default: the numbers every target needs, twice, interleaved."""
        return cls(
            rounds=2,
            main={
                # Both ways classify is served, at 1, at saturation and at the peer's levels.
                **{
                    (model, protocol, "binary"): levels
                    for model in (spec.ENSEMBLE, spec.FUSED)
                    for protocol, levels in (("grpc", [1, 16]), ("http", [1, 8, 16, 32]))
                },
                (spec.CLASSIFIER, "grpc", "binary"): [1, 16],
                (spec.CLASSIFIER, "http", "binary"): [16],
                # 150k floats of JSON per image: perf_analyzer itself is the ceiling here (the
                # null peer's row in docs/performance.md).
                (spec.CLASSIFIER, "http", "json"): [16],
                (spec.PREPROCESS, "grpc", "binary"): [16],
                (spec.POSTPROCESS, "grpc", "binary"): [16],
                (embedding.ENSEMBLE, "grpc", "binary"): [1, 16],
                # The peer's payload, at the levels the embedding targets name.
                (embedding.ENSEMBLE, "http", "json"): [1, 8, 16, 32],
                ("embed_int8", "grpc", "binary"): [16],
                (embedding.GRAPH_ENSEMBLE, "grpc", "binary"): [1, 16],
                # c=16 of embed_graph and of the peer were dropped for the mixed rows: no target
                # names it (embed keeps it for the response-cache ratio).
                (embedding.GRAPH_ENSEMBLE, "http", "json"): [1, 8, 32],
            },
            others={
                "no-batching": [(spec.ENSEMBLE, "grpc", [16]), (spec.CLASSIFIER, "grpc", [16])],
                "instances-2": [(spec.ENSEMBLE, "grpc", [16])],
            },
            rate_fractions=[0.5, 0.9],
            rate_targets=[(spec.ENSEMBLE, "grpc")],
            peer_levels={
                spec.CLASSIFIER: {"binary": [16], "json": [16]},
                spec.ENSEMBLE: {"binary": [8, 32]},  # the whole pipeline, JPEG to top-k
                embedding.ENSEMBLE: {"json": [1, 8, 32]},
            },
            null_levels=[16],
            # JSON is where the generator nears its ceiling, so that ceiling is the one measured.
            null_payloads=("json",),
            cache_levels=[16],
            raw_model_batches=[1, 4, 8, 16, 32],
            raw_pipeline_batches=[1, 8],
            infinity_levels=[1, 8, 32],
            mixed_levels=[8, 32],
            raw_mixed_batches=[8, 32],
            traced=TRACED,
            text_cache=True,
        )

    @classmethod
    def embed_peers(cls) -> Plan:
        """Only the embedding servers side by side: embed, the FastAPI peer and infinity-emb."""
        levels = [1, 8, 32]
        return cls(
            rounds=2,
            main={(embedding.ENSEMBLE, "http", "json"): levels},
            others={},
            rate_fractions=[],
            rate_targets=[],
            peer_levels={embedding.ENSEMBLE: {"json": levels}},
            null_levels=[32],
            null_payloads=("json",),
            cache_levels=[],
            # The raw engine's embed curves only: the limits the embedding targets name.
            raw_model_batches=[],
            raw_pipeline_batches=[],
            infinity_levels=levels,
            mixed_levels=[8, 32],
            raw_mixed_batches=[8, 32],
        )

    @classmethod
    def mixed(cls) -> Plan:
        """Only the mixed-length rows: embed, the FastAPI peer, infinity-emb and the raw engine."""
        return cls(
            rounds=2,
            main={},
            others={},
            rate_fractions=[],
            rate_targets=[],
            peer_levels={embedding.ENSEMBLE: {"json": []}},
            null_levels=[],
            null_payloads=(),
            cache_levels=[],
            raw_model_batches=[],
            raw_pipeline_batches=[],
            raw_embed_batches=[],
            mixed_levels=[8, 32],
            raw_mixed_batches=[8, 32],
        )

    @classmethod
    def classify(cls) -> Plan:
        """Only the image service: classify served, traced step by step, and its raw pipeline."""
        return cls(
            rounds=2,
            main={
                (model, protocol, "binary"): levels
                for model in (spec.ENSEMBLE, spec.FUSED)
                for protocol, levels in (("grpc", [1, 16]), ("http", [1, 8, 16, 32]))
            },
            others={},
            rate_fractions=[],
            rate_targets=[],
            peer_levels={spec.ENSEMBLE: {"binary": [8, 32]}},
            null_levels=[],
            null_payloads=(),
            cache_levels=[],
            raw_model_batches=[1, 4],
            raw_pipeline_batches=[1, 4, 8],
            raw_embed_batches=[],
            traced=TRACED,
        )

    @classmethod
    def full(cls) -> Plan:
        """Everything: all models, protocols and variants over a wide sweep, three rounds."""
        levels = [1, 2, 4, 8, 16, 32]
        main = {(m, p, "binary"): levels for m in MODELS + TEXT_MODELS for p in ("grpc", "http")}
        main[(spec.CLASSIFIER, "http", "json")] = levels
        main[(embedding.ENSEMBLE, "http", "json")] = levels
        main[(embedding.GRAPH_ENSEMBLE, "http", "json")] = levels
        return cls(
            rounds=3,
            main=main,
            others={
                name: [
                    (m, p, levels)
                    for m in (spec.ENSEMBLE, spec.CLASSIFIER)
                    for p in ("grpc", "http")
                ]
                for name in ("no-batching", "instances-2")
            },
            rate_fractions=[0.25, 0.5, 0.75, 0.9, 1.0],
            rate_targets=[
                (m, p) for m in (spec.ENSEMBLE, spec.CLASSIFIER) for p in ("grpc", "http")
            ],
            peer_levels={
                spec.CLASSIFIER: {"binary": levels, "json": levels},
                spec.ENSEMBLE: {"binary": levels},
                embedding.ENSEMBLE: {"binary": levels, "json": levels},
            },
            null_levels=[1, 16, 32],
            null_payloads=("json", "binary"),
            cache_levels=levels,
            raw_model_batches=[1, 2, 4, 8, 16, 32],
            raw_pipeline_batches=[1, 4, 8, 16],
            raw_seconds=3.0,
            measurement_ms=3000,
            infinity_levels=levels,
            mixed_levels=levels,
            raw_mixed_batches=[1, 8, 16, 32, 64],
            traced=TRACED,
            text_cache=True,
        )

    def triton_cases(self, variant: str) -> Iterator[Case]:
        """Concurrency cases of one variant (rate cases depend on this round's results)."""
        if variant == "batching":
            for (model, protocol, payload), levels in self.main.items():
                for level in levels:
                    yield Case("triton", variant, model, protocol, payload, "concurrency", level)
            for level in self.infinity_levels:
                yield Case(
                    "triton", variant, EMBED, "http", "json", "concurrency", level, calls="async"
                )
            for level in self.mixed_levels:
                yield mixed_case("triton", level, variant)
        for model, protocol, levels in self.others.get(variant, []):
            for level in levels:
                yield Case("triton", variant, model, protocol, "binary", "concurrency", level)

    def size(self) -> int:
        """Load levels measured in one round (for progress and ETA)."""
        n = sum(len(v) for v in self.main.values()) + len(self.infinity_levels)
        n += sum(len(levels) for cases in self.others.values() for _, _, levels in cases)
        peers = sum(len(v) for by_payload in self.peer_levels.values() for v in by_payload.values())
        nulls = len(self.null_levels) * sum(
            len(set(by_payload) & set(self.null_payloads))
            for by_payload in self.peer_levels.values()
        )
        rates = len(self.rate_fractions) * len(self.rate_targets)
        # infinity, and the FastAPI peer with async calls, at its levels; its null twin.
        infinity = 2 * len(self.infinity_levels) + (
            len(OPENAI_NULL_LEVELS) if self.infinity_levels or self.mixed_levels else 0
        )
        # embed, the FastAPI peer and infinity-emb over the mixed texts.
        mixed = 3 * len(self.mixed_levels)
        n += len(self.traced)
        return n + rates + peers + nulls + len(self.cache_levels) + infinity + mixed


def mixed_case(system: str, level: int, variant: str = "-") -> Case:
    """A mixed-length case: HTTP, asynchronous calls, JSON (OpenAI-style for infinity-emb)."""
    payload = "openai" if system == "infinity" else "json"
    return Case(
        system, variant, EMBED, "http", payload, "concurrency", level, "mixed", calls="async"
    )


def perf_args(case: Case) -> list[str]:
    """perf_analyzer options a case needs beyond the common ones."""
    # Cache hits answer in microseconds; perf_analyzer's time windows then never finish
    # (seen here with 2.51 at concurrency 16), so count requests instead.
    extra = list(COUNT_WINDOWS) if case.dataset == "repeated" else []
    if case.dataset == "mixed":
        count = max(MIXED_WINDOW_REQUESTS, 4 * int(case.level))
        extra = ["--measurement-mode=count_windows", f"--measurement-request-count={count}"]
    if case.payload == "openai":
        extra += infinity.PERF_ARGS  # its OpenAI client: /embeddings, asynchronous calls
    elif case.calls == "async":
        extra.append("--async")
    return extra


def peer_token_counts(url: str, model: str = EMBED) -> tuple[float, float]:
    """(real, padded) tokens the FastAPI peer's batcher has run so far (its statistics)."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as response:
        entry = json.load(response)["model_stats"][0]
    counts = entry["token_stats"]
    return counts["tokens"], counts["padded_tokens"]


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
        classifier = self.deltas.get(spec.CLASSIFIER)
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


def server_config(cpus: list[int]) -> ServerConfig:
    """A pinned server on free ports, in explicit model control, started with no model loaded.

    ``TritonUnderTest`` loads the models, each with the config of the variant measured.
    """
    return ServerConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        cpus=cpus,
        extra_args=["--model-control-mode=explicit"],
    )


def measure_raw(cpus: list[int], threads: int, plan: Plan, encoders: bool = True) -> dict:
    """The raw engine, pinned to the server's cores with the server's thread budget.

    Returns:
        {kind: {batch size: items/s}} for the classifier ("model"), the classify pipeline
        ("pipeline") and, with ``encoders``, the embed pipeline per encoder ("embed", ...).
    """
    cmd = [
        sys.executable,
        "-m",
        "bench.harness.raw",
        f"--onnx={ONNX}",
        f"--threads={threads}",
        f"--seconds={plan.raw_seconds}",
        "--model-batches=" + ",".join(map(str, plan.raw_model_batches)),
        "--pipeline-batches=" + ",".join(map(str, plan.raw_pipeline_batches)),
        "--embed-batches=" + ",".join(map(str, plan.raw_embed_batches)),
    ]
    if encoders and plan.raw_embed_batches:
        cmd += [f"--encoder={name}={path}" for name, path in ENCODERS.items()]
    if encoders and plan.raw_mixed_batches:
        cmd += [
            f"--mixed-encoder={ENCODERS[EMBED]}",
            "--mixed-batches=" + ",".join(map(str, plan.raw_mixed_batches)),
        ]
    done = subprocess.run(affinity.pinned(cpus, cmd), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"raw engine failed ({done.returncode}):\n{done.stderr[-3000:]}")
    raw = json.loads(done.stdout)
    # A curve of no batch sizes is left out: it was not measured.
    return {
        kind: {int(k): v for k, v in curve.items()}
        for kind, curve in raw.items()
        if isinstance(curve, dict) and curve
    }


def measure_stages(cpus: list[int], seconds: float) -> dict[str, float]:
    """The raw classify pipeline's stages at batch 1, ms per image, pinned to ``cpus``."""
    cmd = [
        sys.executable, "-m", "bench.harness.raw", f"--onnx={ONNX}", "--threads=1",
        f"--seconds={seconds}", "--stages", "--model-batches=", "--pipeline-batches=",
    ]  # fmt: skip
    done = subprocess.run(affinity.pinned(cpus, cmd), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"raw stages failed ({done.returncode}):\n{done.stderr[-3000:]}")
    curves = json.loads(done.stdout)
    return {
        kind.removeprefix(STAGE_KIND): 1000 / curve["1"]
        for kind, curve in curves.items()
        if kind.startswith(STAGE_KIND)
    }


# The cases whose ratios to the raw pipeline (and to each other, through it) are targets: each is
# measured between two readings of the raw pipeline on the same core, seconds apart.
REFERENCED = (spec.ENSEMBLE, spec.FUSED)
REFERENCE_BATCHES = (1, 4)  # batch 1 for concurrency 1; 4, the best batch here, for saturation


class RawReference:
    """The raw classify pipeline in a long-lived process on the server's cores, on request.

    This machine's speed drifts by tens of percent within a minute (docs/performance.md), more
    than the gaps the targets are about: a served case is only comparable with a raw reading
    taken seconds from it, under the same drift. ``measure`` is that reading (``bench.harness.raw
    --serve``; the process idles between readings).
    """

    def __init__(self, cpus: list[int], seconds: float = 1.0):
        self.seconds = seconds
        cmd = affinity.pinned(
            cpus,
            [sys.executable, "-m", "bench.harness.raw", f"--onnx={ONNX}", "--threads=1", "--serve"],
        )
        self.process = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def measure(self) -> dict[int, float]:
        """Images/s of the raw pipeline at each of REFERENCE_BATCHES, now."""
        out = {}
        for batch in REFERENCE_BATCHES:
            self.process.stdin.write(f"{batch} {self.seconds}\n")
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the raw reference exited ({self.process.poll()})")
            out[batch] = json.loads(line)["images_per_s"]
        return out

    def close(self) -> None:
        """Stop the process."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def process_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of a server and each of its stubs: pid → (name, seconds)."""
    out = {}
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:  # gone: nothing to say
        return out
    for process in processes:
        try:
            times = process.cpu_times()
            served = stub_model(process.pid)
            name = served[0] if served else process.name()
            out[process.pid] = (name, times.user + times.system)
        except psutil.Error:  # gone meanwhile
            continue
    return out


def cpu_per_item(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], items: int
) -> dict[str, float] | None:
    """CPU ms per item by process name, from two ``process_cpu`` snapshots (None: no item)."""
    if not items:
        return None
    out: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        if pid in before:
            out[name] = out.get(name, 0.0) + (seconds - before[pid][1]) * 1000 / items
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
        try:
            if referenced:
                readings.append(self.reference.measure())
            before = triton.statistics() if triton else None
            tokens_before = counts() if counts else None
            cpu_before = process_cpu(triton.server.process.pid) if triton else {}
            started = time.monotonic_ns()
            point = perf_analyzer.measure(run, case.level, timeout=self.plan.case_timeout_s)
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
            spec.CLASSIFIER: inputs.write(spec.CLASSIFIER, data_dir, as_json=True),
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
            if variant.name != "batching" and not any(self.plan.triton_cases(variant.name)):
                continue  # nothing of it to measure: no reload
            # Embed's computed path first (perf_analyzer repeats its inputs, which the
            # response cache would answer); the other variants measure classify only.
            cache = False if variant.name == "batching" else None
            self._configure(triton, variant, cache)
            if variant.name == "batching" and triton.running():
                self._pin(r, "tritonserver and its stubs", triton.server.process.pid)
            for case in self.plan.triton_cases(variant.name):
                # Never without a file: perf_analyzer would make up random inputs.
                source = (json_data if case.payload == "json" else data)[case.model]
                if case.dataset == "mixed":
                    source = self.mixed_data[case.payload]
                self._measure(r, case, source, triton)
            if variant.name == "batching":
                self._rate_sweep(r, data, triton)
                self._traced(r, data, triton)
                if not self.plan.cache_levels:
                    continue
                self._configure(triton, variant, cache=True)
                for level in self.plan.cache_levels:
                    # JSON over HTTP: the payload the peer gets, for an equal-p99 row.
                    case = Case(
                        "triton",
                        "batching",
                        embedding.ENSEMBLE,
                        "http",
                        "json",
                        "concurrency",
                        level,
                        dataset="repeated",
                    )
                    self._measure(r, case, repeated, triton)
        peer_data = {
            m: {"json": json_data.get(m), "binary": data[m]} for m in self.plan.peer_levels
        }
        self._peers(r, peer_data, threads)
        if self.plan.infinity_levels or self.plan.mixed_levels:
            self._infinity(r, openai_data)

    def _traced(self, round_: int, data: dict[str, Path], triton: TritonUnderTest) -> None:
        """The plan's traced cases: every request of the model traced while perf_analyzer runs.

        At concurrency 1 the raw pipeline's stages are timed on the server's cores right before
        and after (the server idle) and kept with the row: the reference its per-step times are
        read against, measured seconds from them rather than minutes as the round's raw curves.
        """
        for model, protocol, level in self.plan.traced:
            case = Case("triton", trace.VARIANT, model, protocol, "binary", "concurrency", level)
            stages: list[dict[str, float]] = []
            try:
                self._revive(triton)
                if level == 1:
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
        cases = [
            Case("infinity", "-", EMBED, "http", "openai", "concurrency", level, calls="async")
            for level in self.plan.infinity_levels
        ] + [mixed_case("infinity", level) for level in self.plan.mixed_levels]
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
        null_cases = [
            Case("null-peer", "-", EMBED, "http", "openai", "concurrency", level, calls="async")
            for level in OPENAI_NULL_LEVELS
        ]
        null = infinity.NullOpenAIServer(cpus=self.server_cpus)
        try:
            null.start()
        except Exception as exc:  # noqa: BLE001 - its rows say why; the run goes on
            for case in null_cases:
                self._record(Row(round_, case, None, f"null OpenAI server did not start: {exc}"))
            return
        try:
            for case in null_cases:
                self._measure(round_, case, data, url=null.url)
        finally:
            null.stop()

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
                    == ("triton", "batching", "concurrency")
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
                case = Case("triton", "batching", model, protocol, "binary", "rate", level)
                self._measure(round_, case, data[model], triton)

    def _peers(self, round_: int, data: dict[str, dict[str, Path]], threads: int) -> None:
        """Each peer model, then its null twin (the load generator's ceiling), per payload."""
        from bench.peers.microbatcher import PeerServer

        for model, by_payload in self.plan.peer_levels.items():
            # classify runs the classifier's model.onnx behind its own decode and top-k.
            onnx_path = ENCODERS[EMBED] if model == EMBED else ONNX
            null_levels = {
                payload: self.plan.null_levels
                for payload in by_payload
                if payload in self.plan.null_payloads
            }
            for system, path, levels in (
                ("peer", onnx_path, by_payload),
                ("null-peer", None, null_levels),
            ):
                cases = [
                    Case(system, "-", model, "http", payload, "concurrency", level)
                    for payload, xs in levels.items()
                    for level in xs
                ]
                if system == "peer" and model == EMBED and "json" in by_payload:
                    cases += [
                        Case(
                            system, "-", model, "http", "json", "concurrency", level, calls="async"
                        )
                        for level in self.plan.infinity_levels
                    ]
                    cases += [mixed_case(system, level) for level in self.plan.mixed_levels]
                if not cases:
                    continue
                peer = PeerServer(
                    path, cpus=self.server_cpus, intra_op_threads=threads, model_name=model
                )
                try:
                    peer.start()
                except Exception as exc:  # noqa: BLE001 - its rows say why; the run goes on
                    for case in cases:
                        self._record(Row(round_, case, None, f"peer did not start: {exc}"))
                    continue
                if system == "peer":
                    self._pin(round_, f"FastAPI peer ({model})", peer.process.pid)
                try:
                    for case in cases:
                        source = data[model][case.payload]
                        if case.dataset == "mixed":
                            source = self.mixed_data[case.payload]
                        self._measure(round_, case, source, url=peer.url)
                finally:
                    peer.stop()

    def write_csv(self) -> tuple[Path, Path]:
        """points.csv (one line per measured case and round) and raw.csv."""
        points = self.out_dir / "points.csv"
        lines = [row.flat() for row in self.rows]
        with open(points, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(lines[0]))
            writer.writeheader()
            writer.writerows(lines)
        raw = self.out_dir / "raw.csv"
        with open(raw, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["round", "kind", "batch_size", "throughput"])
            for r, result in enumerate(self.raw, 1):
                for kind, curve in result.items():
                    for bs, value in curve.items():
                        writer.writerow([r, kind, bs, f"{value:.3f}"])
        return points, raw


class TritonUnderTest:
    """The tritonserver a run measures: each variant in a fresh server, restarted if it fails.

    tritonserver 2.51 has aborted, and once hung after corrupting its heap, while old instances
    of Python-backend models unloaded (docs/triton-2.51.md). So a variant is never swapped in
    by reloading steps: it gets a fresh server in explicit model control, into which every model
    is loaded once (the variant's steps with their config overrides, the rest as configured).
    Only ensembles, which run no Python, are reloaded in place (embed's response cache on/off).
    A server that exits or stops answering is replaced by a fresh one with the same variant;
    each server's log is kept as ``tritonserver[-<n>].log``.
    """

    def __init__(self, config: ServerConfig, out_dir: Path, network_timeout_s: float = 30.0):
        self.config = config
        self.out_dir = out_dir
        self.network_timeout_s = network_timeout_s
        self.server: Server | None = None
        self.client: http.InferenceServerClient | None = None
        self.starts = 0
        self.deaths = 0
        self._loaded: tuple[variants.Variant, bool] | None = None
        self._wanted: tuple[variants.Variant, bool] | None = None
        self._hung = False

    def start(self) -> TritonUnderTest:
        """Start a server on fresh free ports with no model loaded."""
        self.starts += 1
        name = "tritonserver.log" if self.starts == 1 else f"tritonserver-{self.starts}.log"
        # Ports of 0 are filled in by the server: each start gets a copy with fresh ones. Tracing
        # is possible but off; the traced cases turn it on for their model (bench/harness/trace.py).
        traces = self.out_dir / trace.FOLDER
        traces.mkdir(parents=True, exist_ok=True)
        trace_args = trace.server_args(traces / f"trace-{self.starts}.json")
        config = dataclasses.replace(self.config, extra_args=[*self.config.extra_args, *trace_args])
        self.server = Server(config, log_path=self.out_dir / name).start()
        self.client = http.InferenceServerClient(
            self.server.http_url, network_timeout=self.network_timeout_s
        )
        self._loaded = None
        self._hung = False
        return self

    def running(self) -> bool:
        """True while the server runs."""
        return self.server is not None and self.server.running()

    def trouble(self, timeout_s: float = 10.0) -> str | None:
        """Why the server cannot be measured (it exited, or does not answer), or None."""
        if not self.running():
            status = self.server.process.returncode if self.server else None
            return f"tritonserver exited (status {status}); its log: {self._log()}"
        if self._hung or not self.server.is_ready(timeout_s):
            self._hung = True  # asked once per server: a hang does not end by itself
            return (
                f"tritonserver stopped answering within {timeout_s:.0f} s; its log: {self._log()}"
            )
        return None

    def _log(self) -> Path | None:
        return self.server.log_path if self.server else None

    def restart(self) -> None:
        """Replace the server (killed if it still runs) by a fresh one with what it had."""
        self.deaths += 1
        if self.running():
            self.server.kill()
        self.close()
        self.start()
        if self._wanted is not None:
            self.configure(*self._wanted)

    def url(self, protocol: str) -> str:
        """host:port of the gRPC or HTTP endpoint."""
        return self.server.grpc_url if protocol == "grpc" else self.server.http_url

    def configure(self, variant: variants.Variant, cache: bool | None = None) -> None:
        """Serve ``variant`` with embed's response cache ``cache``, if not served already.

        Args:
            variant: the serving variant of the steps it names.
            cache: embed's response cache on or off; None leaves it as it is.
        """
        loaded_variant, loaded_cache = self._loaded or (None, True)  # the configs enable it
        cache = loaded_cache if cache is None else cache
        self._wanted = (variant, cache)
        if loaded_variant != variant:
            if self._loaded is not None:  # a fresh server, never a reload of Python steps
                self.close()
                self.start()
            self._load(variant, cache)
        elif loaded_cache != cache:
            name, admin = self.server.config.model_config_name, self.server.admin_headers()
            variants.set_response_cache(
                self.client, EMBED_MODELS, cache, MODEL_REPOSITORY, name, admin
            )
        self._loaded = (variant, cache)

    def _load(self, variant: variants.Variant, cache: bool) -> None:
        """Load every model of both services into the fresh server, the variant's steps first."""
        name, admin = self.server.config.model_config_name, self.server.admin_headers()
        variants.apply(self.client, variant, MODEL_REPOSITORY, name, admin)
        variants.without_text_cache(self.client, MODEL_REPOSITORY, name, admin)
        # embed's ensembles pull in their steps (as configured, or as the variant loaded them).
        variants.set_response_cache(self.client, EMBED_MODELS, cache, MODEL_REPOSITORY, name, admin)
        if spec.ENSEMBLE not in variant.ensembles:
            self.client.load_model(spec.ENSEMBLE, headers=admin)
        self.client.load_model(spec.FUSED, headers=admin)
        self.client.load_model(embedding.GRAPH_ENSEMBLE, headers=admin)

    def statistics(self) -> dict[str, dict]:
        """Statistics of every model the report reads that this server loads."""
        return stats.snapshot(self.client, stats_models(self.server.config.model_config_name))

    def token_counts(self, model: str) -> tuple[float, float]:
        """(real, padded) tokens that ``model``'s padding step has counted so far."""
        step, version = padding_step(model, self.server.config.model_config_name)
        with urllib.request.urlopen(self.server.metrics_url, timeout=10) as response:
            page = response.read().decode()
        return stats.token_counts(page, step, version)

    def close(self) -> None:
        """Stop the server; nothing it started stays behind."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> TritonUnderTest:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def machine() -> dict[str, str]:
    """What the report says about where it ran."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": str(os.cpu_count()), "python": sys.version.split()[0]}
