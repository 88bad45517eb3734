"""Load shedding: an ensemble at a multiple of its capacity, every request counted.

``python -m bench.overload [--service classify|embed]`` starts a tritonserver with the
repository's ``local-shed`` configs (the entrance step refuses beyond a short queue at once;
every step with a queue policy answers a request that waited too long with REJECT), pinned to
one core with the load generator on the other, measures capacity with a short closed loop, then
sends ``--factor`` times that rate open-loop (fixed intervals, whatever the server answers) and
reports: sent, answered (successes and rejections by kind), hung, rejection latency and
admitted latency against the SLO.

The SLO follows from the configs: an admitted request waits at most one queue timeout at each
step with a queue policy, plus the executions (an allowance).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import model_config
from bench import load
from bench.harness import affinity
from client import classify, embed
from export import samples, text_samples
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding
from server import Server, ServerConfig

log = logging.getLogger(__name__)

# Time for the executions on an admitted request's path (one batch at each step), added to the
# queue timeouts to make the SLO of an admitted request: at least this much, or this many
# closed-loop request times of the capacity measurement (a slower machine takes longer).
STEPS_ALLOWANCE_S = 0.5
STEPS_ALLOWANCE_REQUEST_TIMES = 4
# The configs with queue policies (configs/local-shed.pbtxt; not the default, see there).
SHED_CONFIG = "local-shed"


def image_inputs(grpc) -> Callable[[int], list]:
    """``make_inputs(i)``: photo ``i`` of the samples, cycling (one encoded image per request)."""
    tensors = [
        classify.build_inputs(grpc, [samples.photo_bytes(name)], None) for name in samples.PHOTOS
    ]
    return lambda i: tensors[i % len(tensors)]


# One count for the whole process: every make_inputs shares it, so the capacity loop and the
# overload after it never send the same text (each made its own count from 0 before, and the
# response cache answered the overload's first texts).
_TEXT_SERIAL = itertools.count()


def text_inputs(grpc) -> Callable[[int], list]:
    """``make_inputs(i)``: one text per request, never the same one twice in this process.

    ``embed``'s response cache then answers none of them (a cache hit is not work shed);
    ``i`` picks the sentence, a serial number makes it new.
    """

    def make(i: int) -> list:
        text = f"{text_samples.SENTENCES[i % len(text_samples.SENTENCES)]} (#{next(_TEXT_SERIAL)})"
        return embed.build_inputs(grpc, [text])

    return make


@dataclass(frozen=True)
class Service:
    """An ensemble under overload: its batched steps and how to make one request's inputs."""

    ensemble: str
    steps: tuple[str, ...]
    inputs: Callable[[object], Callable[[int], list]]  # tritonclient.grpc -> make_inputs


SERVICES = {
    "classify": Service(
        classification.ENSEMBLE,
        (classification.PREPROCESS, classification.CLASSIFIER, classification.POSTPROCESS),
        image_inputs,
    ),
    "embed": Service(embedding.ENSEMBLE, (embedding.TOKENIZE, embedding.ENCODER), text_inputs),
}


def server_config(service: Service, cpus: list[int] | None = None) -> ServerConfig:
    """Free ports, the ``local-shed`` configs, ``service``'s ensemble only."""
    return ServerConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        cpus=cpus,
        model_config_name=SHED_CONFIG,
        extra_args=["--model-control-mode=explicit", f"--load-model={service.ensemble}"],
    )


def queue_policies(service: Service, config_name: str | None = "local") -> dict:
    """The queue policy of each step of ``service`` that has one, as the server resolves it."""
    policies = {}
    for model in service.steps:
        config = model_config.resolve(MODEL_REPOSITORY / model, config_name)
        if config.dynamic_batching.HasField("default_queue_policy"):
            policies[model] = config.dynamic_batching.default_queue_policy
    return policies


def slo_s(
    service: Service,
    config_name: str | None = "local",
    capacity: float | None = None,
    concurrency: int = 4,
) -> float:
    """Latency bound for an admitted request: every queue timeout on its path + the steps.

    Args:
        service: the ensemble.
        config_name: the configs the server runs with (their queue timeouts count).
        capacity: requests/s measured in a closed loop of ``concurrency`` clients; the steps'
            allowance grows with the request time it implies on a slow machine.
        concurrency: the clients of that measurement.
    """
    policies = queue_policies(service, config_name).values()
    allowance = STEPS_ALLOWANCE_S
    if capacity:
        allowance = max(allowance, STEPS_ALLOWANCE_REQUEST_TIMES * concurrency / capacity)
    return sum(p.default_timeout_microseconds for p in policies) / 1e6 + allowance


@dataclass(frozen=True)
class Report:
    """What one overload run saw."""

    capacity: float  # requests/s, closed loop at the capacity concurrency
    offered: float  # requests/s actually sent
    result: load.Tally
    slo_ms: float
    policies: dict[str, str]  # step -> "max_queue_size N, timeout T ms"
    rejection_ms: dict[str, dict[str, float]]  # rejection kind -> p50/p99/max latency

    def lines(self) -> list[str]:
        """Human-readable summary."""
        r = self.result
        return [
            "queue policies (REJECT): "
            + "; ".join(f"{m}: {p}" for m, p in sorted(self.policies.items())),
            f"capacity {self.capacity:.1f} req/s; offered {self.offered:.1f} req/s "
            f"({self.offered / self.capacity:.1f}x) for {r.seconds:.1f} s",
            f"sent {r.sent}  answered {r.answered}  hung {r.hung}  ok {r.ok}  "
            f"rejected {dict(sorted(r.errors.items()))}",
            f"admitted latency p50 {r.ok_ms.get('p50', 0):.0f} ms, p99 {r.ok_ms.get('p99', 0):.0f}"
            f" ms, max {r.ok_ms.get('max', 0):.0f} ms (SLO {self.slo_ms:.0f} ms)",
            *(
                f"{kind} latency p50 {ms['p50']:.1f} ms, p99 {ms['p99']:.1f} ms, "
                f"max {ms['max']:.1f} ms"
                for kind, ms in sorted(self.rejection_ms.items())
            ),
            f"admitted throughput under overload {r.throughput:.1f} req/s",
        ]


def measure_capacity(url: str, service: Service, concurrency: int, seconds: float) -> float:
    """Successful requests/s of ``service`` in a closed loop (no rejections expected)."""
    import tritonclient.grpc as grpc

    clients = [grpc.InferenceServerClient(url) for _ in range(concurrency)]
    make = service.inputs(grpc)
    serial = itertools.count()
    for _ in range(16):  # first executions initialize lazily: not capacity
        clients[0].infer(service.ensemble, make(next(serial)))
    try:
        tally = load.ClosedLoop(
            lambda w: clients[w].infer(service.ensemble, make(next(serial))),
            concurrency,
            "capacity",
        ).run(seconds)
    finally:
        for c in clients:
            c.close()
    if tally.errors:
        raise RuntimeError(f"errors while measuring capacity: {tally.errors}")
    return tally.throughput


def overload(
    url: str, service: Service, rate: float, seconds: float, client_timeout_s: float
) -> tuple[list[load.Outcome], float]:
    """Open-loop ``service`` at ``rate`` for ``seconds``; every request ends as an outcome."""
    import tritonclient.grpc as grpc

    with grpc.InferenceServerClient(url) as client:
        submit = load.grpc_submitter(
            client, service.ensemble, service.inputs(grpc), client_timeout=client_timeout_s
        )
        # Drain: long enough for the queue to empty, short of "forever".
        return load.open_loop(
            submit, rate, seconds, drain_s=client_timeout_s + 5, kind=service.ensemble
        )


def run(
    server: Server,
    service: Service,
    factor: float = 4.0,
    seconds: float = 6.0,
    capacity_concurrency: int = 4,
    capacity_seconds: float = 4.0,
) -> Report:
    """Measure capacity, then overload at ``factor`` x capacity on a running server."""
    name = server.config.model_config_name
    capacity = measure_capacity(server.grpc_url, service, capacity_concurrency, capacity_seconds)
    slo = slo_s(service, name, capacity, capacity_concurrency)
    outcomes, offered = overload(
        server.grpc_url, service, factor * capacity, seconds, client_timeout_s=4 * slo
    )
    rejected: dict[str, list[float]] = {}
    for o in outcomes:
        if o.error is not None and o.latency_s is not None:
            rejected.setdefault(load.classify_error(o.error), []).append(o.latency_s)
    return Report(
        capacity=capacity,
        offered=offered,
        result=load.tally(outcomes, seconds),
        rejection_ms={kind: load.percentiles(v) for kind, v in rejected.items()},
        slo_ms=slo * 1000,
        policies={
            m: f"max_queue_size {p.max_queue_size}, timeout "
            f"{p.default_timeout_microseconds / 1000:.0f} ms"
            for m, p in queue_policies(service, name).items()
        },
    )


def main(argv: list[str] | None = None) -> int:
    """Run the overload benchmark on its own server and print the report.

    Exit status 1 unless every request was answered, every error was a queue rejection and the
    admitted p99 was within the SLO.
    """
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m bench.overload --factor 4 --seconds 6",
    )
    parser.add_argument("--service", choices=sorted(SERVICES), default="classify")
    parser.add_argument("--factor", type=float, default=4.0, help="offered rate ÷ capacity")
    parser.add_argument("--seconds", type=float, default=6.0, help="how long to overload")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--log", type=Path, help="keep the tritonserver log here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # Server on core 1, this load generator on core 0: open-loop sending at 4x capacity costs
    # a core of its own, which must not come out of the server's.
    server_cpus, load_cpus = affinity.split(server_cores=1)
    os.sched_setaffinity(0, load_cpus)
    service = SERVICES[args.service]
    with Server(server_config(service, server_cpus), log_path=args.log) as server:
        report = run(server, service, args.factor, args.seconds)
    for line in report.lines():
        print(line)
    r = report.result
    unexpected = {k: v for k, v in r.errors.items() if k.startswith("other")}
    within = r.ok_ms.get("p99", 0) <= report.slo_ms
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "capacity": report.capacity,
                    "offered": report.offered,
                    "slo_ms": report.slo_ms,
                    "policies": report.policies,
                    "seconds": r.seconds,
                    "sent": r.sent,
                    "answered": r.answered,
                    "ok": r.ok,
                    "hung": r.hung,
                    "errors": r.errors,
                    "ok_ms": r.ok_ms,
                    "error_ms": r.error_ms,
                    "rejection_ms": report.rejection_ms,
                },
                indent=2,
            )
        )
    return 0 if r.answered == r.sent and not r.hung and not unexpected and within else 1


if __name__ == "__main__":
    sys.exit(main())
