"""SLO tuner: the config with the most throughput whose p99 stays under a target.

``python -m tune classify --p99-ms 100 --budget-s 300`` searches preferred batch size,
max queue delay and instance count of the steps that decide the target's speed:

1. measures the raw engine's batch curve once per thread budget (seconds, in-process);
2. predicts each candidate's capacity and p99 from that curve with a small queueing model
   (service time of a batch, one batch ahead of you, the queue delay, and a tail factor), and
   drops the ones the model says cannot meet the SLO;
3. verifies the best-predicted candidates on the real server with perf_analyzer (concurrency
   doubled until p99 breaks the SLO, then bisected), until the time budget is spent; for a
   server both services share, pairs of each model's best shapes, both loaded at once;
4. writes the winner as the overlay ``model_repository/<step>/configs/<name>.overlay.pbtxt`` (what
   differs from the variant's base) and renders it into ``configs/<name>.pbtxt``.

``--brute-force`` verifies every candidate instead, to check what the pruning costs. One model
alone (the classifier, the encoder) is tuned by Triton Model Analyzer's quick search instead
(``tune.session.SEARCH``): side by side it found as much in no more time.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import model_config
from bench.harness import perf_analyzer, variants
from pipelines import classification, embedding

log = logging.getLogger(__name__)

# One server that both services share, loaded at once: the classifier and the encoder.
SHARED = "shared"
BATCHES = (1, 2, 4, 8, 16, 32)
DELAYS_US = (0, 500, 2000, 5000)
# p99 ≈ TAIL × mean for these closed-loop runs (observed p99/p50 of 1.1-1.4 here).
TAIL = 1.4


@dataclass(frozen=True)
class Candidate:
    """One point of the search space."""

    preferred_batch: int
    delay_us: int
    instances: int

    def label(self) -> str:
        """Short name."""
        return f"batch={self.preferred_batch} delay={self.delay_us}us instances={self.instances}"


# One candidate per tuned step: what another tool may pick for an ensemble's steps.
Pick = dict[str, Candidate]


def label(pick: Candidate | Pick) -> str:
    """Short name of a candidate, or of one candidate per step."""
    if isinstance(pick, Candidate):
        return pick.label()
    if not pick:
        return "as served"
    return "; ".join(f"{step}: {c.label()}" for step, c in pick.items())


@dataclass(frozen=True)
class Prediction:
    """What the queueing model expects of a candidate."""

    candidate: Candidate
    capacity: float  # items/s at saturation
    p99_ms: float  # at saturation

    def feasible(self, slo_ms: float) -> bool:
        """Whether the model expects the SLO to hold at saturation."""
        return self.p99_ms <= slo_ms


def threads_for(candidate: Candidate, cores: int) -> int:
    """Threads per instance for onnxruntime: the server's cores split between instances."""
    return max(1, cores // candidate.instances)


def predict(
    candidate: Candidate, raw: dict[int, float], cores: int, overhead_ms: float = 0.0
) -> Prediction:
    """Capacity and p99 of a candidate from the raw curve of its thread budget.

    A request at saturation waits for the batch ahead of it, then for its own; the queue delay
    adds up to ``delay_us`` when batches do not fill. Instances share the server's cores, so
    capacity is ``instances × raw(b)`` only while each has cores of its own.

    Args:
        candidate: the configuration.
        raw: items/s of ONE instance at each batch size, with that instance's thread budget.
        cores: cores the server is pinned to.
        overhead_ms: serving cost per execution beyond the raw engine (measured or 0).
    """
    threads = threads_for(candidate, cores)
    b = candidate.preferred_batch
    if b not in raw:
        b = max(size for size in raw if size <= b)
    service_ms = 1000.0 * b / raw[b] + overhead_ms
    # Instances run in parallel only as far as there are cores for their threads.
    parallel = min(candidate.instances, max(1.0, cores / threads))
    capacity = parallel * 1000.0 * b / service_ms
    mean_ms = 2 * service_ms + candidate.delay_us / 1000.0
    return Prediction(candidate, capacity, TAIL * mean_ms)


def candidates(max_batch: int, max_instances: int) -> list[Candidate]:
    """The whole search space."""
    return [
        Candidate(b, d, n)
        for b, d, n in itertools.product(BATCHES, DELAYS_US, range(1, max_instances + 1))
        if b <= max_batch
    ]


def rank(
    space: Sequence[Candidate],
    raw_by_threads: dict[int, dict[int, float]],
    cores: int,
    slo_ms: float,
) -> list[Prediction]:
    """Feasible candidates, best predicted capacity first (smaller batches break ties)."""
    predictions = []
    for c in space:
        prediction = predict(c, raw_by_threads[threads_for(c, cores)], cores)
        if prediction.feasible(slo_ms):
            predictions.append(prediction)
    return sorted(
        predictions,
        key=lambda p: (-p.capacity, p.candidate.delay_us, p.candidate.preferred_batch),
    )


@dataclass(frozen=True)
class Verified:
    """A candidate measured on the server: its best throughput within the SLO."""

    candidate: Candidate | Pick
    throughput: float  # 0 when even concurrency 1 breaks the SLO
    p99_ms: float
    concurrency: int
    seconds: float


def max_throughput_under_slo(
    measure: Callable[[int], perf_analyzer.Point], slo_ms: float, max_concurrency: int = 64
) -> tuple[float, float, int]:
    """(throughput, p99, concurrency) of the best measured level whose p99 meets the SLO.

    Doubles the concurrency until p99 breaks the SLO, then bisects once between the last good
    and the first bad level. It also stops after two doublings in a row that add under 2 %:
    a plateau, where more clients only add queueing (one flat step can be noise, or batches
    that have not started to fill).
    """
    best = (0.0, float("inf"), 0)
    good, bad = 0, None
    level, previous, flat = 1, 0.0, 0
    while level <= max_concurrency:
        point = measure(level)
        if point.p99_ms > slo_ms:
            bad = level
            break
        if point.throughput > best[0]:
            best = (point.throughput, point.p99_ms, level)
        good = level
        flat = flat + 1 if point.throughput < previous * 1.02 else 0
        if flat >= 2:
            break
        previous = max(previous, point.throughput)
        level *= 2
    if bad is not None and good and bad - good > 1:
        mid = (good + bad) // 2
        point = measure(mid)
        if point.p99_ms <= slo_ms and point.throughput > best[0]:
            best = (point.throughput, point.p99_ms, mid)
    return best


def verify(
    candidate: Candidate | Pick,
    load: Callable[[Candidate | Pick], None],
    measure: Callable[[int], perf_analyzer.Point],
    slo_ms: float,
) -> Verified:
    """Load a candidate on the server and find its best throughput within the SLO."""
    started = time.monotonic()
    load(candidate)
    throughput, p99, level = max_throughput_under_slo(measure, slo_ms)
    return Verified(candidate, throughput, p99, level, time.monotonic() - started)


def search(
    ranked: Sequence[Prediction],
    load: Callable[[Candidate], None],
    measure: Callable[[int], perf_analyzer.Point],
    slo_ms: float,
    budget_s: float,
    progress: Callable[[str], None] = print,
) -> list[Verified]:
    """Verify candidates until the budget is spent (always at least one).

    Stage 1 verifies one candidate per (batch, instances) shape, the smallest feasible delay,
    in predicted order: the raw curve is only a few percent apart between neighbouring batch
    sizes, so the shapes are measured rather than trusted. Stage 2 spends what is left on the
    other queue delays of the best measured shape.
    """
    # What stage 1 and the best shape's other delays can take, for the ETA.
    first = shapes(ranked)
    budget = _Budget(budget_s, len(first) + len(DELAYS_US) - 1, progress)

    def run(prediction: Prediction) -> None:
        result = verify(prediction.candidate, load, measure, slo_ms)
        budget.record(result, prediction)

    for prediction in first:
        if not budget.affordable():
            return budget.results
        run(prediction)
    winner = best(budget.results)
    if winner is None:
        return budget.results
    tried = {r.candidate for r in budget.results}
    for prediction in ranked:
        c = prediction.candidate
        same_shape = (c.preferred_batch, c.instances) == (
            winner.candidate.preferred_batch,
            winner.candidate.instances,
        )
        if same_shape and c not in tried:
            if not budget.affordable():
                break
            run(prediction)
    return budget.results


def shapes(ranked: Sequence[Prediction]) -> list[Prediction]:
    """The best-predicted candidate of each (batch, instances) shape, in predicted order."""
    first: dict[tuple[int, int], Prediction] = {}
    for p in ranked:
        first.setdefault((p.candidate.preferred_batch, p.candidate.instances), p)
    return list(first.values())


def shared_picks(ranked: dict[str, Sequence[Prediction]], per_model: int = 3) -> list[Pick]:
    """A shared server's candidates: each model's best shapes predicted alone, paired.

    Loaded together the models split the server's cores, which no raw curve of one model
    predicts, so each model's ranking alone only orders the pairs: the top ``per_model`` shapes
    of each, the pairs of better-ranked shapes first; none where a model has no feasible shape.
    """
    tops = {model: shapes(r)[:per_model] for model, r in ranked.items()}
    if len(tops) != 2:
        raise ValueError(f"a shared server pairs two models' shapes, not {list(tops)}")
    (a, first), (b, second) = tops.items()
    order = sorted(
        itertools.product(range(len(first)), range(len(second))), key=lambda ij: (sum(ij), ij)
    )
    return [{a: first[i].candidate, b: second[j].candidate} for i, j in order]


def search_picks(
    picks: Sequence[Pick],
    load: Callable[[Pick], None],
    measure: Callable[[int], perf_analyzer.Point],
    slo_ms: float,
    budget_s: float,
    progress: Callable[[str], None] = print,
) -> list[Verified]:
    """Verify picks in order until the budget is spent (always at least one)."""
    budget = _Budget(budget_s, len(picks), progress)
    for pick in picks:
        if not budget.affordable():
            break
        budget.record(verify(pick, load, measure, slo_ms))
    return budget.results


class _Budget:
    """The verifications of a search, and whether the next one fits in its time budget."""

    def __init__(self, budget_s: float, work: int, progress: Callable[[str], None]):
        self.budget_s, self.work, self.progress = budget_s, work, progress
        self.started = time.monotonic()
        self.results: list[Verified] = []

    def affordable(self) -> bool:
        """Always the first; then while the next, as long as the mean one, fits."""
        spent = time.monotonic() - self.started
        return not self.results or spent + spent / len(self.results) <= self.budget_s

    def record(self, result: Verified, prediction: Prediction | None = None) -> None:
        """Keep a verification; print it under a progress line with the ETA."""
        self.results.append(result)
        spent = time.monotonic() - self.started
        left = max(0, self.work - len(self.results))
        line = eta_line(len(self.results), spent, self.budget_s, left)
        self.progress(f"{line}\n{_line(result, prediction)}")


def _line(result: Verified, prediction: Prediction | None = None) -> str:
    predicted = (
        f"predicted {prediction.capacity:7.1f}/s p99 {prediction.p99_ms:6.1f} ms -> "
        if prediction
        else ""
    )
    return (
        f"  {label(result.candidate):40s} {predicted}measured {result.throughput:7.1f}/s "
        f"p99 {result.p99_ms:6.1f} ms at c={result.concurrency} ({result.seconds:.0f} s)"
    )


def eta_line(done: int, spent_s: float, budget_s: float, left: int) -> str:
    """``[3 verified, 95 s of 300 s, ETA 140 s]``: what is left of the budget, or of the work.

    The next verification takes about as long as the ones before; the search stops when the
    budget or the candidates run out, whichever comes first.
    """
    per = spent_s / done if done else 0.0
    eta = min(max(0.0, budget_s - spent_s), per * left)
    return f"[{done} verified, {spent_s:.0f} s of {budget_s:.0f} s, ETA {eta:.0f} s]"


def verify_all(
    space: Sequence[Candidate],
    load: Callable[[Candidate], None],
    measure: Callable[[int], perf_analyzer.Point],
    slo_ms: float,
    progress: Callable[[str], None] = print,
) -> list[Verified]:
    """Brute force: verify every candidate, no model, no budget."""
    results = []
    for candidate in space:
        results.append(verify(candidate, load, measure, slo_ms))
        progress(_line(results[-1]))
    return results


def best(results: Sequence[Verified]) -> Verified | None:
    """The verified candidate with the most throughput within the SLO."""
    feasible = [r for r in results if r.throughput > 0]
    return max(feasible, key=lambda r: r.throughput) if feasible else None


def tuned_models(model: str) -> tuple[str, ...]:
    """Which step configs a tuning target changes.

    The classifier, plus preprocess for the classify ensemble: its instances and batching decide
    how fast images reach the classifier. For embed, the encoder (tokenize is cheap). For the
    shared server, the model of each service that does its work.
    """
    targets = {
        SHARED: (classification.CLASSIFIER, embedding.ENCODER),
        classification.CLASSIFIER: (classification.CLASSIFIER,),
        embedding.ENCODER: (embedding.ENCODER,),
        classification.ENSEMBLE: (classification.PREPROCESS, classification.CLASSIFIER),
        embedding.ENSEMBLE: (embedding.ENCODER,),
    }
    if model not in targets:
        raise ValueError(f"can tune {', '.join(targets)}, not {model!r}")
    return targets[model]


def serves_tuned_steps(model: str, repository: Path, config_name: str | None) -> bool:
    """Whether ``model`` runs the steps this tuner changes when served with ``config_name``.

    embed on the CPU configs is one step, tokenize_encode, and never reaches the encoder that
    is tuned here; its tuned configs (local-tuned) keep tokenize -> encoder.
    """
    config = model_config.resolve(repository / model, config_name)
    steps = {s.model_name for s in config.ensemble_scheduling.step} or {model}
    return set(tuned_models(model)) <= steps


# The raw curve (bench.harness.raw) that predicts each target's capacity: the encoder's is embed's
# (tokenizing is a few per cent of it).
RAW_KIND = {
    classification.CLASSIFIER: "model",
    embedding.ENCODER: "embed",
    classification.ENSEMBLE: "pipeline",
    embedding.ENSEMBLE: "embed",
}
# What can be tuned: a model or ensemble (a raw curve predicts it), or the shared server.
TARGETS = (*RAW_KIND, SHARED)
# The encoder has two versions loaded; the fp32 one is what embed serves and what is tuned.
MODEL_VERSIONS = {embedding.ENCODER: "1"}


def perf_analyzer_flags(model: str) -> list[str]:
    """perf_analyzer's flags for a target beyond the common ones (its model version)."""
    return ["-x", MODEL_VERSIONS[model]] if model in MODEL_VERSIONS else []


def steps_of(model: str) -> tuple[str, ...]:
    """Every step whose config a pick for ``model`` may change.

    Another tool's pick may change more of them than this tuner does: Model Analyzer's changes
    classify's postprocess too.
    """
    return variants.STEPS if model == classification.ENSEMBLE else tuned_models(model)


def variant_for(pick: Candidate | Pick, model: str, cores: int) -> variants.Variant:
    """The config changes a candidate makes (the same on every tuned step, or one per step)."""
    steps = tuned_models(model)
    if isinstance(pick, Candidate):
        pick = dict.fromkeys(steps, pick)
    if not set(pick) <= set(steps_of(model)):
        raise ValueError(f"{model}'s steps are {steps_of(model)}, not {tuple(pick)}")
    changes = {
        step: [
            variants.with_instances(c.instances),
            variants.with_batching([c.preferred_batch], c.delay_us),
            variants.with_threads(threads_for(c, cores)),
        ]
        for step, c in pick.items()
    }
    if model == embedding.ENSEMBLE:
        return variants.Variant(
            "tuned",
            label(pick),
            changes,
            models=steps_of(model),
            ensembles=(embedding.ENSEMBLE, embedding.INT8_ENSEMBLE),
        )
    if model in (embedding.ENCODER, SHARED):
        return variants.Variant("tuned", label(pick), changes, models=steps_of(model), ensembles=())
    return variants.Variant("tuned", label(pick), changes)


def write_configs(
    variant: variants.Variant,
    repository: Path,
    base_config_name: str | None,
    name: str,
    header: str,
) -> list[Path]:
    """Write each changed step's tuned config as an overlay, then render it.

    The overlay ``configs/<name>.overlay.pbtxt`` holds the fields where the tuned config differs
    from the base of variant ``name`` (model_config/), under ``header`` as a comment;
    it replaces a link to another variant's overlay instead of writing through it.

    Returns:
        The rendered ``configs/<name>.pbtxt`` of each changed step (what Triton reads).
    """
    paths = []
    for step, config in variant.configs(repository, base_config_name).items():
        if step not in variant.changes:
            continue
        model_dir = repository / step
        overlay = model_config.overlay_path(model_dir, name)
        base = model_config.base_config(model_dir, name)
        overlay.parent.mkdir(exist_ok=True)
        overlay.unlink(missing_ok=True)
        overlay.write_text(f"# {header}\n" + model_config.overlay_text(config, base))
        paths.append(model_config.config_path(model_dir, name))
    model_config.render_repository(repository, models=[p.parent.parent.name for p in paths])
    return paths


def head_to_head(
    a: Candidate,
    b: Candidate,
    load: Callable[[Candidate], None],
    measure: Callable[[int], perf_analyzer.Point],
    slo_ms: float,
    rounds: int = 2,
    progress: Callable[[str], None] = print,
) -> tuple[float, float]:
    """Median throughput within the SLO of ``a`` and ``b``, re-verified alternately.

    The same candidate measured twice minutes apart differs by 10-15 % here, so two winners
    found at different times are compared again side by side.
    """
    scores: dict[Candidate, list[float]] = {a: [], b: []}
    for _ in range(rounds):
        for candidate in (a, b):
            result = verify(candidate, load, measure, slo_ms)
            scores[candidate].append(result.throughput)
            progress(_line(result))
    return statistics.median(scores[a]), statistics.median(scores[b])


def summary(
    results: Sequence[Verified],
    brute: Sequence[Verified] | None,
    rematch: tuple[float, float] | None = None,
) -> dict:
    """JSON-able comparison of the tuner with a brute-force sweep (and their rematch)."""
    ours = best(results)
    out = {
        "tuner": dataclasses.asdict(ours) if ours else None,
        "tuner_seconds": sum(r.seconds for r in results),
        "tuner_verified": len(results),
    }
    if brute is not None:
        theirs = best(brute)
        out["brute_force"] = dataclasses.asdict(theirs) if theirs else None
        out["brute_force_seconds"] = sum(r.seconds for r in brute)
        out["brute_force_verified"] = len(brute)
        if ours and theirs:
            out["tuner_vs_brute_force"] = ours.throughput / theirs.throughput
    if rematch:
        out["rematch_throughput"] = {"tuner": rematch[0], "brute_force": rematch[1]}
        out["rematch_tuner_vs_brute_force"] = rematch[0] / rematch[1] if rematch[1] else None
    return json.loads(json.dumps(out, default=str))


def describe(config_path: Path) -> str:
    """One line naming a written config (for the CLI)."""
    config = model_config.parse(config_path)
    groups = ", ".join(f"{g.count}x {instance_kind_name(g.kind)}" for g in config.instance_group)
    batching = config.dynamic_batching
    return (
        f"{config_path}: preferred {list(batching.preferred_batch_size)}, delay "
        f"{batching.max_queue_delay_microseconds} us, instances {groups}"
    )


def instance_kind_name(kind: int) -> str:
    """KIND_CPU / KIND_GPU name of an instance-group kind."""
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.ModelInstanceGroup.Kind.Name(kind)
