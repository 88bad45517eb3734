"""What a benchmark run measures: the cases, their load levels and perf_analyzer options."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import model_config
from bench.harness import inputs, trace, variants
from bench.peers import infinity
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding

ONNX = MODEL_REPOSITORY / classification.CLASSIFIER / "1" / "model.onnx"


# The image service's models: the ensemble, its steps, and the same pipeline in one step.
MODELS = (classification.ENSEMBLE, *variants.STEPS, classification.FUSED)


EMBED_MODELS = inputs.EMBED_MODELS


TEXT_MODELS = inputs.TEXT_MODELS


EMBED = embedding.ENSEMBLE


# The OpenAI client's ceiling (null server) at concurrency 1 only: at higher levels perf_analyzer
# 2.51's OpenAI client hung or did not stabilize against a server that answers in microseconds;
# at 1 it is a lower bound of the ceiling, still far above what infinity-emb reaches (figures:
# docs/performance.md#how-infinity-emb-runs).
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
TRACED = [(classification.ENSEMBLE, p, level) for p in ("grpc", "http") for level in (1, 16)] + [
    (classification.FUSED, p, 1) for p in ("grpc", "http")
]


# The default run traces one case: the ensemble at 1 over gRPC, where its serving overhead per
# step is read; the thorough run traces them all.
TRACED_ONE = [(classification.ENSEMBLE, "grpc", 1)]


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


def classify_served(
    http: tuple[int, ...] = (1, 8, 16, 32),
) -> dict[tuple[str, str, str], list[int]]:
    """Both ways classify is served (the ensemble and the fused model), at the levels it needs.

    gRPC at 1 and at saturation; HTTP at 1 and the pipeline peer's levels (8 and 32, where it
    saturates too), with 16 beside them unless ``http`` leaves it out: what its targets need.
    Fresh lists each call, so that a plan may change its own.
    """
    return {
        (model, protocol, "binary"): list(levels)
        for model in (classification.ENSEMBLE, classification.FUSED)
        for protocol, levels in (("grpc", (1, 16)), ("http", http))
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
    """What a run measures. ``short()``: the default run, every ratio the targets name.

    ``thorough()`` adds the levels and variants no target needs, every traced case and the
    per-text cache; ``full()`` is everything. Each includes infinity-emb's rows: one start per
    round, and its installation on first use. How long each takes:
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
        """The default: the levels every target needs, in one round.

        Each case feeds a ratio of docs/performance.md's targets or a figure it quotes; what
        ``thorough()`` measures besides them has no target (tests/unit/test_plan.py checks both).
        Every ratio is still taken within the round; one round is what fits the default's time
        budget here (docs/performance.md#how-long-a-run-takes), and ``--rounds 2`` adds the
        spread. The peers, infinity-emb and the mixed-length rows are the thorough run's.
        """
        plan = cls.thorough()
        plan.rounds = 1
        plan.main = {
            # HTTP at saturation is read at 8 and 32, the pipeline peer's levels.
            **classify_served(http=(1, 8, 32)),
            (classification.CLASSIFIER, "grpc", "binary"): [16],
            (classification.CLASSIFIER, "http", "binary"): [16],
            (classification.CLASSIFIER, "http", "json"): [16],
            (classification.PREPROCESS, "grpc", "binary"): [16],
            (classification.POSTPROCESS, "grpc", "binary"): [16],
            # Saturation on short texts, and INT8 beside it.
            (embedding.ENSEMBLE, "grpc", "binary"): [16],
            (embedding.ENSEMBLE, "http", "json"): [1, 8, 32],
            ("embed_int8", "grpc", "binary"): [16],
            (embedding.GRAPH_ENSEMBLE, "grpc", "binary"): [16],
            (embedding.GRAPH_ENSEMBLE, "http", "json"): [1, 8, 32],
        }
        # The other variants and the Poisson sweep name no target.
        plan.others = {}
        plan.rate_fractions, plan.rate_targets = [], []
        # The classifier runs best in small batches here (docs/performance.md, "Batching").
        plan.raw_model_batches = [1, 4, 8]
        plan.traced = list(TRACED_ONE)
        plan.text_cache = False  # python -m bench.text_cache, or --thorough
        return plan

    @classmethod
    def thorough(cls) -> Plan:
        """The default run before 2026-12-04, then the per-text cache (docs/performance.md)."""
        return cls(
            rounds=2,
            main={
                **classify_served(),
                (classification.CLASSIFIER, "grpc", "binary"): [1, 16],
                (classification.CLASSIFIER, "http", "binary"): [16],
                # 150k floats of JSON per image: perf_analyzer itself is the ceiling here (the
                # report's load-generator headroom rows, docs/perf/2026-12-03/report.md).
                (classification.CLASSIFIER, "http", "json"): [16],
                (classification.PREPROCESS, "grpc", "binary"): [16],
                (classification.POSTPROCESS, "grpc", "binary"): [16],
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
                "no-batching": [
                    (classification.ENSEMBLE, "grpc", [16]),
                    (classification.CLASSIFIER, "grpc", [16]),
                ],
                "instances-2": [(classification.ENSEMBLE, "grpc", [16])],
            },
            rate_fractions=[0.5, 0.9],
            rate_targets=[(classification.ENSEMBLE, "grpc")],
            peer_levels={
                classification.CLASSIFIER: {"binary": [16], "json": [16]},
                classification.ENSEMBLE: {"binary": [8, 32]},  # the whole pipeline, JPEG to top-k
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
            main=classify_served(),
            others={},
            rate_fractions=[],
            rate_targets=[],
            peer_levels={classification.ENSEMBLE: {"binary": [8, 32]}},
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
        main[(classification.CLASSIFIER, "http", "json")] = levels
        main[(embedding.ENSEMBLE, "http", "json")] = levels
        main[(embedding.GRAPH_ENSEMBLE, "http", "json")] = levels
        return cls(
            rounds=3,
            main=main,
            others={
                name: [
                    (m, p, levels)
                    for m in (classification.ENSEMBLE, classification.CLASSIFIER)
                    for p in ("grpc", "http")
                ]
                for name in ("no-batching", "instances-2")
            },
            rate_fractions=[0.25, 0.5, 0.75, 0.9, 1.0],
            rate_targets=[
                (m, p)
                for m in (classification.ENSEMBLE, classification.CLASSIFIER)
                for p in ("grpc", "http")
            ],
            peer_levels={
                classification.CLASSIFIER: {"binary": levels, "json": levels},
                classification.ENSEMBLE: {"binary": levels},
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
        if variant == variants.SERVED:
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

    def cache_cases(self) -> list[Case]:
        """Embed answered from its response cache: one repeated text, HTTP JSON (the peer's)."""
        return [
            Case("triton", variants.SERVED, EMBED, "http", "json", "concurrency", level, "repeated")
            for level in self.cache_levels
        ]

    def traced_cases(self) -> list[Case]:
        """The traced cases: the served configs with every request traced."""
        return [
            Case("triton", trace.VARIANT, model, protocol, "binary", "concurrency", level)
            for model, protocol, level in self.traced
        ]

    def peer_cases(self, model: str) -> dict[str, list[Case]]:
        """The FastAPI peer's cases for one model, then its null twin's: system -> cases."""
        by_payload = self.peer_levels.get(model, {})
        peer = [
            Case("peer", "-", model, "http", payload, "concurrency", level)
            for payload, levels in by_payload.items()
            for level in levels
        ]
        if model == EMBED and "json" in by_payload:
            # Beside infinity-emb, in its calling mode; and the mixed-length texts.
            peer += [
                Case("peer", "-", model, "http", "json", "concurrency", level, calls="async")
                for level in self.infinity_levels
            ]
            peer += [mixed_case("peer", level) for level in self.mixed_levels]
        null = [
            Case("null-peer", "-", model, "http", payload, "concurrency", level)
            for payload in by_payload
            if payload in self.null_payloads
            for level in self.null_levels
        ]
        return {"peer": peer, "null-peer": null}

    def infinity_cases(self) -> list[Case]:
        """infinity-emb's cases: short texts at its levels, then the mixed-length texts."""
        return [
            Case("infinity", "-", EMBED, "http", "openai", "concurrency", level, calls="async")
            for level in self.infinity_levels
        ] + [mixed_case("infinity", level) for level in self.mixed_levels]

    def openai_null_cases(self) -> list[Case]:
        """The OpenAI client's ceiling, measured wherever infinity-emb is."""
        if not (self.infinity_levels or self.mixed_levels):
            return []
        return [
            Case("null-peer", "-", EMBED, "http", "openai", "concurrency", level, calls="async")
            for level in OPENAI_NULL_LEVELS
        ]

    def cases(self) -> list[Case]:
        """Every case of one round but the rate levels (those depend on the round's results)."""
        out = [c for name in (variants.SERVED, *self.others) for c in self.triton_cases(name)]
        out += self.traced_cases() + self.cache_cases()
        for model in self.peer_levels:
            out += [c for cases in self.peer_cases(model).values() for c in cases]
        return out + self.infinity_cases() + self.openai_null_cases()

    def size(self) -> int:
        """Load levels measured in one round (for progress and ETA)."""
        return len(self.cases()) + len(self.rate_fractions) * len(self.rate_targets)


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
