"""What the gateway costs: the same texts straight to Triton, through nginx, and as OpenAI calls.

``python -m bench.gateway`` starts one tritonserver and the gateway in front of it (nginx with
OpenAI's embeddings API, gateway/openai.js), both held to the server's core, and drives them
with perf_analyzer from the other core, one text per request, asynchronous calls, at each
concurrency:

* ``triton``: ``embed`` over HTTP with binary tensors, straight to the server;
* ``nginx``: the same requests through the gateway's proxy (``/v2``);
* ``openai``: ``POST /v1/embeddings`` bodies of the same texts through the gateway, which calls
  ``embed_with_tokens`` (the same steps, and each text's word pieces), answered as floats;
* ``openai-b64``: the same, answered in base64 (what OpenAI's SDK asks by default);
* ``triton-grpc`` and ``nginx-grpc``: ``embed`` over gRPC, straight and through the gateway
  (which reads the model name from each body, written to a file as it arrives);
* ``nginx-tls`` and ``nginx-grpc-tls``: ``nginx`` and ``nginx-grpc`` through a second gateway
  that speaks TLS only (a certificate of a CA made for the run, which perf_analyzer trusts);
  the table's last lines give TLS ÷ plain.

The response cache is off for both models (perf_analyzer repeats its texts). Systems are
interleaved within each round, so a busy machine slows each alike; the table gives texts/s and
p99 per round, the median ratio to ``triton`` (gRPC: to ``triton-grpc``), and where the core's
time went: the share nginx took, and tritonserver's CPU time per text (both trees of processes,
over each measurement)::

    .venv/bin/python -m bench.gateway --rounds 3 --levels 8,32
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import psutil
import tritonclient.http as httpclient

from bench.harness import affinity, compare, inputs, perf_analyzer, variants
from bench.harness.pki import Pki, make_pki
from gateway.nginx.config import TLS, Clients, Gateway, OpenAI, Upstreams
from gateway.nginx.process import Nginx
from paths import MODEL_REPOSITORY
from pipelines import embedding
from server import Server, ServerConfig

log = logging.getLogger(__name__)

SYSTEMS = (
    "triton", "nginx", "nginx-tls", "openai", "openai-b64",
    "triton-grpc", "nginx-grpc", "nginx-grpc-tls",
)  # fmt: skip
# What each system's ratio is to: the same protocol straight to Triton.
BASE = {"triton-grpc": "triton-grpc", "nginx-grpc": "triton-grpc", "nginx-grpc-tls": "triton-grpc"}
# TLS ÷ plain: each TLS system and its plain-text twin.
PLAIN = {"nginx-tls": "nginx", "nginx-grpc-tls": "nginx-grpc"}
MODELS = (embedding.ENSEMBLE, embedding.OPENAI_MODELS[embedding.ENSEMBLE])


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and everything under it, so far."""
    total = 0.0
    root = psutil.Process(pid)
    for process in (root, *root.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.Error:  # gone meanwhile
            continue
        total += times.user + times.system
    return total


def runs(
    server: Server,
    nginx: Nginx,
    tls: Nginx,
    ca: Path,
    data: dict[str, Path],
    cpus,
    measurement_ms: int,
):
    """The perf_analyzer run of each system (levels are given per measurement)."""
    common = {
        "protocol": "http",
        "measurement_ms": measurement_ms,
        "cpus": cpus,
        "extra": ["--async"],
    }
    openai = {**common, "extra": ["--service-kind=openai", "--endpoint=v1/embeddings", "--async"]}
    grpc = {**common, "protocol": "grpc"}
    # perf_analyzer checks the TLS gateway's certificate against the run's own CA.
    https = [
        "--ssl-https-verify-peer=1",
        "--ssl-https-verify-host=2",
        f"--ssl-https-ca-certificates-file={ca}",
    ]
    grpcs = ["--ssl-grpc-use-ssl", f"--ssl-grpc-root-certifications-file={ca}"]

    def run(url: str, payload: str, options: dict) -> perf_analyzer.Run:
        return perf_analyzer.Run(embedding.ENSEMBLE, url, input_data=data[payload], **options)

    return {
        "triton": run(server.http_url, "kserve", common),
        "nginx": run(nginx.http_url, "kserve", common),
        "openai": run(nginx.http_url, "openai", openai),
        "openai-b64": run(nginx.http_url, "openai-b64", openai),
        "triton-grpc": run(server.grpc_url, "kserve", grpc),
        "nginx-grpc": run(nginx.grpc_url, "kserve", grpc),
        "nginx-tls": run(
            f"https://{tls.http_url}", "kserve", {**common, "extra": [*common["extra"], *https]}
        ),
        "nginx-grpc-tls": run(tls.grpc_url, "kserve", {**grpc, "extra": [*grpc["extra"], *grpcs]}),
    }


class CoreShare(NamedTuple):
    """Where the core's time went over one measurement."""

    nginx: float  # nginx's share of the core (0 to 1)
    triton_ms_per_text: float  # tritonserver's CPU time per text answered


Points = dict[tuple[str, int], list[perf_analyzer.Point]]  # (system, level) -> a point per round
Shares = dict[tuple[str, int], list[CoreShare]]  # (system, level) -> a share per round


def main(argv: list[str] | None = None) -> int:
    """Print texts/s and p99 per system, level and round, and the ratios to ``triton``."""
    args = compare.arguments(
        argv, __doc__, "python -m bench.gateway --rounds 3 --levels 8,32", (3, "8,32", 5000)
    )
    server_cpus, load_cpus = affinity.split()
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=0, cpus=server_cpus)
    # No model at start: the embedding step is loaded first with its per-text cache off (a
    # Python step is never reloaded: docs/triton-2.51.md), then the ensembles with theirs off.
    config.extra_args = ["--model-control-mode=explicit"]
    with tempfile.TemporaryDirectory() as tmp, Server(config) as server:
        data = _write_inputs(Path(tmp))
        _turn_caches_off(server)
        pki = make_pki(Path(tmp))
        with _gateways(server, pki, max(args.levels)) as (nginx, tls):
            for name, front in (("nginx", nginx), ("nginx-tls", tls)):
                log.info("%s", affinity.pin_and_report(name, front.process.pid, server_cpus))
            log.info("server and nginx on cores %s, perf_analyzer on %s", server_cpus, load_cpus)
            by_system = runs(server, nginx, tls, pki.ca, data, load_cpus, args.measurement_ms)
            points, shares = _measure(by_system, server, nginx, tls, args.levels, args.rounds)
    _print_table(points, shares, args.levels)
    _print_tls_cost(points, args.levels)
    return 0


def _write_inputs(tmp: Path) -> dict[str, Path]:
    """perf_analyzer's input files: KServe tensors, OpenAI bodies, and those asking base64."""
    return {
        "kserve": inputs.write(embedding.ENSEMBLE, tmp),
        "openai": inputs.write(embedding.ENSEMBLE, tmp, openai=True),
        "openai-b64": inputs.write(embedding.ENSEMBLE, tmp, openai=True, encoding_format="base64"),
    }


def _turn_caches_off(server: Server) -> None:
    """Load the models with embed's per-text cache and the response cache off."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        variants.without_text_cache(
            client, MODEL_REPOSITORY, server.config.model_config_name, server.admin_headers()
        )
        variants.set_response_cache(
            client,
            MODELS,
            False,
            MODEL_REPOSITORY,
            server.config.model_config_name,
            server.admin_headers("http"),
        )


@contextlib.contextmanager
def _gateways(server: Server, pki: Pki, highest_level: int) -> Iterator[tuple[Nginx, Nginx]]:
    """The gateway in front of ``server`` twice: plain, and TLS only with the run's certificate."""
    gateway = Gateway(
        Upstreams.of(server),
        # Every client here is 127.0.0.1: no per-address cap below the highest level.
        # perf_analyzer reads the model's config and statistics: this machine is the operator.
        clients=Clients(conns_per_client=4 * highest_level, operators=("127.0.0.1",)),
        openai=OpenAI(),
    )
    with (
        Nginx(gateway) as nginx,
        Nginx(replace(gateway, tls=TLS(str(pki.certificate), str(pki.key)))) as tls,
    ):
        yield nginx, tls


def _measure(
    by_system: dict[str, perf_analyzer.Run],
    server: Server,
    nginx: Nginx,
    tls: Nginx,
    levels: list[int],
    rounds: int,
) -> tuple[Points, Shares]:
    """Every system at every level in each round, the first system rotating by round."""
    points: Points = {}
    shares: Shares = {}
    for r in range(rounds):
        for level in levels:
            for system in compare.rotation(SYSTEMS, r):
                front = tls if system in PLAIN else nginx
                point, share = _measure_once(
                    by_system[system], level, front.process.pid, server.process.pid
                )
                points.setdefault((system, level), []).append(point)
                shares.setdefault((system, level), []).append(share)
                log.info(
                    "round %d %-10s c=%-3d %7.1f texts/s  p99 %6.1f ms  nginx %4.1f %%"
                    "  tritonserver %.2f ms/text",
                    r + 1,
                    system,
                    level,
                    point.throughput,
                    point.p99_ms,
                    100 * share.nginx,
                    share.triton_ms_per_text,
                )
    return points, shares


def _measure_once(
    run: perf_analyzer.Run, level: int, nginx_pid: int, triton_pid: int
) -> tuple[perf_analyzer.Point, CoreShare]:
    """One perf_analyzer measurement, and the CPU time nginx and tritonserver spent meanwhile."""
    began = (time.monotonic(), *map(cpu_seconds, (nginx_pid, triton_pid)))
    point = perf_analyzer.measure(run, level)
    ended = (time.monotonic(), *map(cpu_seconds, (nginx_pid, triton_pid)))
    wall, nginx_cpu, triton_cpu = (b - a for a, b in zip(began, ended, strict=True))
    return point, CoreShare(nginx_cpu / wall, 1000 * triton_cpu / wall / point.throughput)


def _print_table(points: Points, shares: Shares, levels: list[int]) -> None:
    """Each system's rounds, its median ÷ its protocol's straight system, and the core's split."""
    print(
        "\nsystem      c     texts/s (rounds)        p99 ms (rounds)         ÷ triton"
        "  nginx  tritonserver ms/text (medians)"
    )
    for level in levels:
        for system in SYSTEMS:
            got = points[(system, level)]
            base = compare.median_rate(points[(BASE.get(system, "triton"), level)])
            rates, p99s = compare.per_round(got)
            nginx_share = statistics.median(s.nginx for s in shares[(system, level)])
            per_text = statistics.median(s.triton_ms_per_text for s in shares[(system, level)])
            print(
                f"{system:11s} {level:<5d} {rates:23s} {p99s:23s} "
                f"{compare.median_rate(got) / base:5.2f}x"
                f"  {100 * nginx_share:4.1f}%  {per_text:.2f}"
            )


def _print_tls_cost(points: Points, levels: list[int]) -> None:
    """TLS ÷ plain: each TLS system's median rate over its plain-text twin's."""
    print("\nTLS ÷ plain, texts/s (medians over rounds; the same gateway config but TLS)")
    for system, plain in PLAIN.items():
        for level in levels:
            got, base = (compare.median_rate(points[(s, level)]) for s in (system, plain))
            print(f"{system:15s} c={level:<4d} {got / base:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
