"""Contention: interactive embedding queries on a server saturated by images and bulk embeddings.

``python -m bench.contention`` starts one tritonserver (explicit model control,
``--rate-limit=execution_count``, the ``local-shared`` configs) and measures, in one run, each
serving setup below while three streams share the server's core:

* **images**: the classifier saturated by a closed loop of single images (its own process);
* **bulk**: embeddings of documents, a deep closed loop on the encoder (its own process);
* **queries**: interactive ``embed`` requests (``client.embed.EmbedClient``), one at a time,
  paced, each text new (no cache hit), whose latency is what we protect.

Setups: ``both`` is ``configs/local-shared.pbtxt`` of the classifier and the encoder as they
are; the others take something out of it (overrides loaded through the model-control API):

* ``none``: no rate-limiter resources, no priority levels, queries without a priority;
* ``priority``: the encoder's batcher with 2 priority levels (default 2), queries sent with
  priority 1: a query goes to the head of the encoder's queue instead of behind the bulk backlog;
* ``limiter``: classifier and encoder instances each need the one global ``cpu_slot``, the
  encoder with rate-limiter priority 100 (twice the turns of the classifier's 200): their
  executions no longer overlap on the core;
* ``both``: limiter and priorities: a query skips the backlog *and* waits for at most one
  execution in progress instead of sharing the core with all of them.

Every setup serves the encoder with the two instances of ``local-shared`` (that file says why).
Before the setups, the queries run ``alone`` (no background) for reference.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import model_config
from bench import load
from bench.harness import affinity, stats
from client.embed import EmbedClient
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding, padding
from server import Server, ServerConfig

log = logging.getLogger(__name__)

SHARED_CONFIG = "local-shared"  # configs/local-shared.pbtxt: the "both" setup
RESOURCE = "cpu_slot"  # the rate-limiter resource those configs name; the server has one
SETUPS = ("none", "priority", "limiter", "both")
ALONE = "alone"  # the queries with no background: what "keeps its p99" is measured against
IMAGE_CONCURRENCY = 4
# Deep enough that the encoder's queue stays full also while the load core is shared with
# other work (32 left it empty between bursts there; docs/operations.md).
BULK_CONCURRENCY = 64
QUERY_INTERVAL_S = 0.02
STREAM_START_S = 120.0  # a spawned stream's imports and first answers, on a busy core
BACKGROUND_LIMIT_S = 600.0  # a stream whose parent died stops by itself
QUERY_PRIORITY = 1  # the higher of the encoder's two levels (1 is served first)
# Every query text is new, in every setup and round: embed's response cache answers none.
_QUERY_SERIAL = itertools.count()


def server_config(cpus: list[int] | None = None) -> ServerConfig:
    """A server whose models can be reloaded with overrides, with the rate limiter on.

    With ``execution_count`` on, instances that declare no resources still queue in the rate
    limiter, behind its head (encoder/configs/local-shared.pbtxt). In ``none`` and ``priority``
    no instance asks for the slot, so none waits for another there.
    """
    return ServerConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        cpus=cpus,
        model_config_name=SHARED_CONFIG,
        extra_args=[
            "--model-control-mode=explicit",
            "--load-model=*",
            "--rate-limit=execution_count",
            f"--rate-limit-resource={RESOURCE}:1",
        ],
    )


def configs(setup: str) -> dict:
    """The classifier and encoder configs of one setup: ``local-shared``, less what it drops."""
    out = {}
    for model in (classification.CLASSIFIER, embedding.ENCODER):
        config = model_config.resolve(MODEL_REPOSITORY / model, SHARED_CONFIG)
        for group in config.instance_group:
            names = {r.name for r in group.rate_limiter.resources}
            if names != {RESOURCE}:
                raise ValueError(f"{model}: {SHARED_CONFIG} must ask for {RESOURCE}, not {names}")
            if setup in ("none", "priority"):
                group.ClearField("rate_limiter")
        if setup in ("none", "limiter"):
            config.dynamic_batching.ClearField("priority_levels")
            config.dynamic_batching.ClearField("default_priority_level")
        out[model] = config
    return out


def apply(server: Server, client, setup: str) -> None:
    """Load one setup's configs (and reload ``embed``, which pins the encoder)."""
    headers = server.admin_headers("grpc")
    for model, config in configs(setup).items():
        client.load_model(model, config=model_config.to_json(config), headers=headers)
    client.load_model(embedding.ENSEMBLE, headers=headers)


def _encoder_inputs(grpc, text: str) -> list:
    ids, mask = padding.tokenize([text])
    inputs = []
    for name, array in ((embedding.INPUT_IDS, ids), (embedding.ATTENTION_MASK, mask)):
        tensor = grpc.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _background(url: str, kind: str, concurrency: int, ready, stop, results) -> None:
    """One background stream in its own process (so its client threads share no GIL with ours).

    Inputs are built once: the load generator must spend its core on sending, not on
    tokenizing or preprocessing (the encoder has no response cache, so repeating a few
    documents is the same work as new ones). The stream sets ``ready`` once each of its
    workers could have had an answer, and loads the server until ``stop`` is set: how long
    the process takes to start (seconds, on a busy core) is no longer part of the window.
    """
    import tritonclient.grpc as grpc

    from export import samples, text_samples
    from pipelines import image

    pixels = image.preprocess(samples.photo_bytes("chelsea"))[None]
    documents = [f"{s} (document {i})" for i, s in enumerate(text_samples.SENTENCES * 4)]
    clients: dict = {}

    def call(worker: int) -> None:
        client = clients.get(worker) or clients.setdefault(worker, grpc.InferenceServerClient(url))
        if kind == "images":
            tensor = grpc.InferInput(classification.PIXELS, list(pixels.shape), "UINT8")
            tensor.set_data_from_numpy(pixels)
            client.infer(classification.CLASSIFIER, [tensor])
        else:
            inputs = prepared[worker % len(prepared)]
            client.infer(embedding.ENCODER, inputs, model_version="1")

    try:
        prepared = [_encoder_inputs(grpc, d) for d in documents]
        stream = load.ClosedLoop(call, concurrency, kind).start()
        while len(stream.outcomes) < concurrency and not stop.wait(0.01):
            pass
        ready.set()
        stop.wait(BACKGROUND_LIMIT_S)
        results.put((kind, stream.stop()))
    except Exception as exc:  # noqa: BLE001 - the parent reports it instead of waiting forever
        results.put((kind, exc))
    finally:
        ready.set()


@dataclass(frozen=True)
class Result:
    """One setup: the queries' latency and what the background streams got done."""

    setup: str
    queries: load.Tally
    images: load.Tally
    bulk: load.Tally
    # The queries' mean latency inside the server, from embed's statistics: what the server
    # makes them wait, without the time a busy client machine takes to read the answers.
    server_ms: float = 0.0


def measure(server: Server, setup: str, seconds: float) -> Result:
    """Apply ``setup``, run the three streams together for ``seconds``, and tally them.

    ``ALONE`` runs the queries on the ``none`` configs with no background streams.
    """
    import tritonclient.grpc as grpc

    priority = QUERY_PRIORITY if setup in ("priority", "both") else 0
    with (
        grpc.InferenceServerClient(server.grpc_url) as admin,
        EmbedClient(server.grpc_url, "grpc", priority=priority) as client,
    ):
        apply(server, admin, "none" if setup == ALONE else setup)

        def query(_worker: int) -> None:
            client.embed([f"a cat sleeping on a sofa (query {next(_QUERY_SERIAL)})"])

        for _ in range(10):
            query(0)  # warm the reloaded instances

        def measured_queries():
            before = stats.snapshot(admin, [embedding.ENSEMBLE], as_json=True)
            tally = load.ClosedLoop(query, 1, "queries", QUERY_INTERVAL_S).run(seconds - 1.0)
            after = stats.snapshot(admin, [embedding.ENSEMBLE], as_json=True)
            return tally, stats.delta(before, after)[embedding.ENSEMBLE].request_ms

        if setup == ALONE:
            idle = load.tally([], seconds)
            queries, server_ms = measured_queries()
            return Result(setup, queries, idle, idle, server_ms)
        ctx = mp.get_context("spawn")
        results, stop = ctx.Queue(), ctx.Event()
        streams = {"images": IMAGE_CONCURRENCY, "bulk": BULK_CONCURRENCY}
        ready = {kind: ctx.Event() for kind in streams}
        workers = [
            ctx.Process(
                target=_background, args=(server.grpc_url, kind, n, ready[kind], stop, results)
            )
            for kind, n in streams.items()
        ]
        for w in workers:
            w.start()
        try:
            # Measure only once both streams flow: a fixed sleep here once let the queries
            # run before the background had started (docs/operations.md).
            late = [kind for kind, event in ready.items() if not event.wait(STREAM_START_S)]
            if late:
                raise RuntimeError(f"background stream(s) {late} not answered in time")
            time.sleep(1.0)  # the backlog building up
            queries, server_ms = measured_queries()
            stop.set()
            background = dict(results.get(timeout=120) for _ in workers)
        finally:
            stop.set()
            for w in workers:
                w.join(30)
                if w.is_alive():
                    w.kill()
    for kind, value in background.items():
        if isinstance(value, Exception):
            raise RuntimeError(f"{kind} stream failed: {value}")
    return Result(setup, queries, background["images"], background["bulk"], server_ms)


def run(setups=SETUPS, seconds: float = 8.0, rounds: int = 1) -> list[Result]:
    """Start a server, measure the queries ``ALONE``, then every setup ``rounds`` times."""
    results = []
    # The server on one core, every load generator on the other: the contention measured is
    # the models' own, not the clients' (spawned workers inherit this process's affinity).
    server_cpus, load_cpus = affinity.split(server_cores=1)
    os.sched_setaffinity(0, load_cpus)
    with Server(server_config(server_cpus)) as server:
        results.append(measure(server, ALONE, seconds))
        log.info("%s", row(results[-1]))
        for r in range(rounds):
            order = list(setups)[r % len(setups) :] + list(setups)[: r % len(setups)]
            for setup in order:
                result = measure(server, setup, seconds)
                log.info("round %d %s: %s", r + 1, setup, row(result))
                results.append(result)
    return results


def row(result: Result) -> str:
    """One line of the table."""
    q = result.queries
    return (
        f"{result.setup:9s} queries p50 {q.ok_ms.get('p50', 0):7.1f} ms  "
        f"p99 {q.ok_ms.get('p99', 0):7.1f} ms  (n={q.ok}, errors {sum(q.errors.values())})  "
        f"server mean {result.server_ms:6.1f} ms  "
        f"images {result.images.throughput:6.1f}/s  bulk {result.bulk.throughput:6.1f} texts/s"
    )


def main(argv: list[str] | None = None) -> int:
    """Print the table: query p50/p99 and background throughput per setup, and p99 ratios."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m bench.contention --seconds 8 --rounds 2",
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="load per setup and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"subset of {SETUPS}")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = run(args.setups.split(","), args.seconds, args.rounds)
    print("\nsetup     interactive queries (encoder)                     background")
    for result in results:
        print(row(result))
    by_setup: dict[str, list[float]] = {}
    for result in results:
        by_setup.setdefault(result.setup, []).append(result.queries.ok_ms.get("p99", 0.0))
    alone = by_setup.pop(ALONE)[0]
    none = float(np.median(by_setup["none"])) if "none" in by_setup else None
    for setup, p99s in by_setup.items():
        p99 = float(np.median(p99s))
        versus_none = f", ÷ none: {p99 / none:.2f}x" if none else ""
        print(f"query p99, {setup}: {p99:.1f} ms; ÷ alone: {p99 / alone:.2f}x{versus_none}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "setup": r.setup,
                        "queries_ms": r.queries.ok_ms,
                        "queries": r.queries.ok,
                        "server_ms": r.server_ms,
                        "images_per_s": r.images.throughput,
                        "bulk_per_s": r.bulk.throughput,
                        "errors": sum(
                            sum(t.errors.values()) + t.hung for t in (r.queries, r.images, r.bulk)
                        ),
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    failed = any(
        sum(t.errors.values()) or t.hung for r in results for t in (r.queries, r.images, r.bulk)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
