"""The per-text embedding cache under retrieval traffic, beside Triton's response cache.

``make perf`` runs it after its rounds (``python -m bench.text_cache`` alone). Requests of
REQUEST_TEXTS texts each, drawn from a Zipf distribution over DISTINCT distinct queries, go
through ``text_embeddings`` (a 1-D batch of texts, as retrieval clients send them) to fresh
servers pinned to the server's cores, with Redis on the load generator's:

* ``no cache``: the step's cache off, embed's response cache off;
* ``response cache``: Triton's response cache only, which keys whole requests;
* ``per-text cache``: the step's LRU and Redis, with the response cache as served.

Each at the same concurrency levels, over the same sequence of requests, twice in turn. Then
traffic whose every text is new, against no cache (what the cache costs when it never hits),
and a second replica, started fresh on the same Redis, asked the requests the first one served:
the share of its texts Redis already had. Texts/s are perf_analyzer's requests/s times
REQUEST_TEXTS; hit ratios come from the step's own counters over each case.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import time
import urllib.request
from pathlib import Path

import numpy as np

import model_config
from bench.harness import affinity, perf_analyzer, stats, variants
from bench.report.ratios import NotComputable, equal_p99_ratio
from export import text_samples
from paths import MODEL_REPOSITORY
from pipelines import embedding
from server import Server, ServerConfig
from server.redis import RedisServer

log = logging.getLogger(__name__)

DISTINCT = 10_000
REQUEST_TEXTS = 8
ZIPF_EXPONENT = 1.0  # p(rank k) ∝ 1 / k^s: the classic word-frequency law
REQUESTS = 20_000  # more than any case sends: perf_analyzer never wraps to repeat the start
NEW_REQUESTS = 8_000  # every text distinct, for the all-miss case
LEVELS = (4, 16)
PASSES = 2  # each setup measured twice, in turn, against the machine's drift
REPLICA_REQUESTS = 400  # of the first replica's first requests, asked of the second
SEED = 3
SETUPS = ("no cache", "response cache", "per-text cache")
MODEL = embedding.TEXTS_ENSEMBLE
STEP = {"model": embedding.TOKENIZE_ENCODE, "version": "1"}
# Targets, as ratios in one run (docs/performance.md).
VS_RESPONSE_CACHE = 2.0
ALL_MISS = 0.95
REPLICA_HIT_RATIO = 0.95


def zipf_requests(texts: list[str], requests: int, seed: int = SEED) -> list[list[str]]:
    """``requests`` requests of REQUEST_TEXTS texts, each drawn by Zipf's law over ``texts``."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, len(texts) + 1, dtype=np.float64)
    weights = ranks**-ZIPF_EXPONENT
    order = rng.permutation(len(texts))  # which text has which rank: not the list's order
    drawn = rng.choice(len(texts), size=(requests, REQUEST_TEXTS), p=weights / weights.sum())
    return [[texts[order[i]] for i in row] for row in drawn]


def write_data(path: Path, requests: list[list[str]]) -> Path:
    """perf_analyzer's --input-data: one ``input_text`` [REQUEST_TEXTS] entry per request."""
    data = [{embedding.TEXTS: {"content": texts, "shape": [len(texts)]}} for texts in requests]
    path.write_text(json.dumps({"data": data}))
    return path


def step_counts(server: Server) -> dict[str, float]:
    """The step's cache counters now: hits by layer and misses."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        page = response.read().decode()
    return stats.text_cache_counts(page, STEP["model"], STEP["version"])


def hit_ratio(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Share of looked-up texts a cache layer answered between two readings."""
    hits = sum(after[k] - before[k] for k in ("local", "redis"))
    misses = after["misses"] - before["misses"]
    return hits / (hits + misses) if hits + misses else None


@dataclasses.dataclass
class Case:
    """One measured case: a setup at one level, with what the step's cache did meanwhile."""

    setup: str
    level: int
    point: perf_analyzer.Point | None
    hit_ratio: float | None = None
    error: str = ""

    @property
    def texts_per_s(self) -> float | None:
        """The point's requests/s times the texts in each."""
        return self.point.throughput * REQUEST_TEXTS if self.point else None


def server_config(cpus: list[int], url: str | None) -> ServerConfig:
    """A pinned server in explicit model control, nothing loaded, the cache's Redis at ``url``."""
    return ServerConfig(
        http_port=0, grpc_port=0, metrics_port=0, cpus=cpus, text_cache_url=url,
        extra_args=["--model-control-mode=explicit"],
    )  # fmt: skip


def load_setup(server: Server, text_cache: bool, response_cache: bool) -> None:
    """Load text_embeddings with the step's cache and embed's response cache as asked."""
    import tritonclient.http as http

    name, admin = server.config.model_config_name, server.admin_headers()
    with http.InferenceServerClient(server.http_url) as client:
        step = model_config.resolve(MODEL_REPOSITORY / embedding.TOKENIZE_ENCODE, name)
        if not text_cache:
            step.parameters["text_cache_bytes"].string_value = "0"
        client.load_model(
            embedding.TOKENIZE_ENCODE, config=model_config.to_json(step), headers=admin
        )
        variants.set_response_cache(
            client, (embedding.ENSEMBLE,), response_cache, MODEL_REPOSITORY, name, admin
        )
        client.load_model(MODEL, headers=admin)


def measure(server: Server, setup: str, level: int, data: Path, client_cpus: list[int]) -> Case:
    """perf_analyzer at one concurrency against ``server``; a failure is recorded, not raised."""
    run = perf_analyzer.Run(
        model=MODEL, url=server.grpc_url, protocol="grpc", input_data=data,
        measurement_ms=2000, stability_percent=30, cpus=client_cpus,
    )  # fmt: skip
    before = step_counts(server)
    try:
        point = perf_analyzer.measure(run, level, timeout=300)
    except Exception as exc:  # noqa: BLE001 - one case must not end the run
        return Case(setup, level, None, error=f"{type(exc).__name__}: {exc}")
    return Case(setup, level, point, hit_ratio(before, step_counts(server)))


def ask_replica(server: Server, requests: list[list[str]]) -> float | None:
    """Send ``requests`` one after another; the share of their texts a cache layer answered."""
    import tritonclient.grpc as grpc

    before = step_counts(server)
    with grpc.InferenceServerClient(server.grpc_url) as client:
        for texts in requests:
            tensor = grpc.InferInput(embedding.TEXTS, [len(texts)], "BYTES")
            tensor.set_data_from_numpy(np.array([t.encode() for t in texts], np.object_))
            client.infer(MODEL, [tensor])
    return hit_ratio(before, step_counts(server))


def run(out: Path, server_cpus: list[int], client_cpus: list[int]) -> dict:
    """Every case; writes ``text_cache.json`` into ``out`` and returns what it holds."""
    out.mkdir(parents=True, exist_ok=True)
    queries = text_samples.sentences(DISTINCT + NEW_REQUESTS * REQUEST_TEXTS, SEED)
    zipf = zipf_requests(queries[:DISTINCT], REQUESTS)
    fresh = [queries[DISTINCT + i * REQUEST_TEXTS :][:REQUEST_TEXTS] for i in range(NEW_REQUESTS)]
    data = write_data(out / "text-cache-zipf.json", zipf)
    new = write_data(out / "text-cache-new.json", fresh)
    cases: list[Case] = []
    replica = None
    with RedisServer(log_path=out / "redis.log") as cache:
        affinity.pin(cache.process.pid, client_cpus)
        flags = {"no cache": (False, False), "response cache": (False, True),
                 "per-text cache": (True, True)}  # fmt: skip
        for n in range(PASSES):
            for setup in SETUPS:
                # Every pass from an empty cache: the same warm-up for each setup and pass.
                _flush(cache)
                url = cache.url if setup == "per-text cache" else None
                with Server(server_config(server_cpus, url), log_path=out / "tc-server.log") as s:
                    load_setup(s, *flags[setup])
                    for level in LEVELS:
                        cases.append(measure(s, setup, level, data, client_cpus))
                        log.info("%s", _line(cases[-1]))
                    if setup == "per-text cache" and n == 0:
                        config = server_config(server_cpus, cache.url)
                        with Server(config, log_path=out / "tc-replica.log") as second:
                            load_setup(second, True, True)
                            replica = ask_replica(second, zipf[:REPLICA_REQUESTS])
                        log.info("second replica's hit ratio: %s", replica)
        for _ in range(PASSES):  # every text new: what the cache costs when it never hits
            for setup, on in (("all new, no cache", False), ("all new, per-text cache", True)):
                _flush(cache)
                config = server_config(server_cpus, cache.url if on else None)
                with Server(config, log_path=out / "tc-server.log") as s:
                    load_setup(s, on, on)
                    cases.append(measure(s, setup, LEVELS[-1], new, client_cpus))
                    log.info("%s", _line(cases[-1]))
    result = {
        "distinct": DISTINCT, "request_texts": REQUEST_TEXTS, "zipf_exponent": ZIPF_EXPONENT,
        "levels": list(LEVELS), "passes": PASSES, "replica_hit_ratio": replica,
        "replica_requests": REPLICA_REQUESTS,
        "cases": [
            {"setup": c.setup, "level": c.level, "texts_per_s": c.texts_per_s,
             "p50_ms": c.point and c.point.p50_ms, "p99_ms": c.point and c.point.p99_ms,
             "hit_ratio": c.hit_ratio, "error": c.error}
            for c in cases
        ],
    }  # fmt: skip
    (out / "text_cache.json").write_text(json.dumps(result, indent=2))
    return result


def _flush(cache: RedisServer) -> None:
    import redis

    redis.Redis.from_url(cache.url).flushall()


def _line(case: Case) -> str:
    if case.point is None:
        return f"{case.setup} c={case.level}: FAILED {case.error.splitlines()[0]}"
    ratio = "" if case.hit_ratio is None else f", per-text hit ratio {case.hit_ratio:.3f}"
    return (
        f"{case.setup} c={case.level}: {case.texts_per_s:.0f} texts/s, "
        f"p99 {case.point.p99_ms:.1f} ms{ratio}"
    )


# The report ---------------------------------------------------------------------------------
def targets(result: dict) -> list[tuple[str, float | NotComputable | None, float, bool]]:
    """(target, value, threshold, higher is better) from one run's cases, medians of passes."""

    def points(setup: str) -> list[dict]:
        found = [c for c in result["cases"] if c["setup"] == setup and c["texts_per_s"]]
        return [
            {"throughput": c["texts_per_s"], "p99_ms": c["p99_ms"], "level": c["level"]}
            for c in found
        ]

    def per_pass(setup: str) -> list[list[dict]]:
        chunks = points(setup)
        size = len(LEVELS)
        return [chunks[i : i + size] for i in range(0, len(chunks), size)]

    ratios = [
        equal_p99_ratio(ours, theirs)
        for ours, theirs in zip(
            per_pass("per-text cache"), per_pass("response cache"), strict=False
        )
    ]
    numbers = [r for r in ratios if isinstance(r, float)]
    vs_response = float(np.median(numbers)) if numbers else next(iter(ratios), None)
    new = [
        (a["throughput"], b["throughput"])
        for a, b in zip(
            points("all new, per-text cache"), points("all new, no cache"), strict=False
        )
    ]
    all_miss = float(np.median([a / b for a, b in new])) if new else None
    return [
        ("per-text cache ÷ Triton's response cache, texts/s at equal p99", vs_response,
         VS_RESPONSE_CACHE, True),
        ("every text new: per-text cache ÷ no cache, texts/s", all_miss, ALL_MISS, True),
        ("a second replica's hit ratio on what the first one served", result["replica_hit_ratio"],
         REPLICA_HIT_RATIO, True),
    ]  # fmt: skip


def section(result: dict) -> list[str]:
    """The report's lines: every case, the hit ratio reached, the targets."""
    lines = [
        "",
        "## The per-text embedding cache (Zipf traffic)",
        "",
        f"Requests of {result['request_texts']} texts drawn by Zipf's law (s = "
        f"{result['zipf_exponent']:g}) over {result['distinct']:,} distinct queries, through "
        f"`{MODEL}` over gRPC, each setup on a fresh server from an empty cache, "
        f"{result['passes']} passes in turn (`bench/text_cache.py`). Hit ratio: the share of "
        "texts the step's cache answered (its LRU or Redis), from its counters over the case.",
        "",
        "| setup | concurrency | texts/s | p50 ms | p99 ms | per-text hit ratio |",
        "|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        if c["texts_per_s"] is None:
            lines.append(f"| {c['setup']} | {c['level']} | failed: {c['error'][:80]} | | | |")
            continue
        hits = "–" if c["hit_ratio"] is None else f"{c['hit_ratio']:.3f}"
        lines.append(
            f"| {c['setup']} | {c['level']} | {c['texts_per_s']:.0f} | {c['p50_ms']:.1f} | "
            f"{c['p99_ms']:.1f} | {hits} |"
        )
    lines += ["", "| target | measured | target | met |", "|---|---|---|---|"]
    for name, value, threshold, higher in targets(result):
        if value is None:
            lines.append(f"| {name} | not measured | ≥ {threshold:g} | |")
        elif isinstance(value, NotComputable):
            lines.append(f"| {name} | n/a: {value} | ≥ {threshold:g} | |")
        else:
            met = value >= threshold if higher else value <= threshold
            lines.append(
                f"| {name} | {value:.3f} | ≥ {threshold:g} | {'yes' if met else '**no**'} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.text_cache --out DIR``: the cases, their JSON and report lines."""
    p = argparse.ArgumentParser(prog="python -m bench.text_cache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("results") / time.strftime("text-cache-%H%M%S"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server_cpus, client_cpus = affinity.split()
    result = run(args.out, server_cpus, client_cpus)
    print("\n".join(section(result)))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
