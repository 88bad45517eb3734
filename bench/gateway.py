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

import logging
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil
import tritonclient.http as httpclient

from bench.harness import affinity, compare, inputs, variants
from bench.harness import perf_analyzer as pa
from bench.harness.pki import make_pki
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
    return {
        "triton": pa.Run(embedding.ENSEMBLE, server.http_url, input_data=data["kserve"], **common),
        "nginx": pa.Run(embedding.ENSEMBLE, nginx.http_url, input_data=data["kserve"], **common),
        "openai": pa.Run(embedding.ENSEMBLE, nginx.http_url, input_data=data["openai"], **openai),
        "openai-b64": pa.Run(
            embedding.ENSEMBLE, nginx.http_url, input_data=data["openai-b64"], **openai
        ),
        "triton-grpc": pa.Run(
            embedding.ENSEMBLE, server.grpc_url, input_data=data["kserve"], **grpc
        ),
        "nginx-grpc": pa.Run(embedding.ENSEMBLE, nginx.grpc_url, input_data=data["kserve"], **grpc),
        "nginx-tls": pa.Run(
            embedding.ENSEMBLE,
            f"https://{tls.http_url}",
            input_data=data["kserve"],
            **{**common, "extra": [*common["extra"], *https]},
        ),
        "nginx-grpc-tls": pa.Run(
            embedding.ENSEMBLE,
            tls.grpc_url,
            input_data=data["kserve"],
            **{**grpc, "extra": [*grpc["extra"], *grpcs]},
        ),
    }


def main(argv: list[str] | None = None) -> int:
    """Print texts/s and p99 per system, level and round, and the ratios to ``triton``."""
    args = compare.arguments(
        argv, __doc__, "python -m bench.gateway --rounds 3 --levels 8,32", (3, "8,32", 5000)
    )
    levels = args.levels
    server_cpus, load_cpus = affinity.split()
    # No model at start: the embedding step is loaded first with its per-text cache off (a
    # Python step is never reloaded: docs/triton-2.51.md), then the ensembles with theirs off.
    extra = ["--model-control-mode=explicit"]
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=0, cpus=server_cpus)
    config.extra_args = extra
    points: dict[tuple[str, int], list[pa.Point]] = {}
    # (system, level) -> [(nginx's share of the core, tritonserver's CPU ms per text)]
    shares: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, Server(config) as server:
        data = {
            "kserve": inputs.write(embedding.ENSEMBLE, Path(tmp)),
            "openai": inputs.write(embedding.ENSEMBLE, Path(tmp), openai=True),
            "openai-b64": inputs.write(
                embedding.ENSEMBLE, Path(tmp), openai=True, encoding_format="base64"
            ),
        }
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
        # Every client here is 127.0.0.1: no per-address cap below the highest level.
        conns = 4 * max(levels)
        # perf_analyzer reads the model's config and statistics: this machine is the operator.
        pki = make_pki(Path(tmp))
        gateway = Gateway(
            Upstreams.of(server),
            clients=Clients(conns_per_client=conns, operators=("127.0.0.1",)),
            openai=OpenAI(),
        )
        with (
            Nginx(gateway) as nginx,
            Nginx(replace(gateway, tls=TLS(str(pki.certificate), str(pki.key)))) as tls,
        ):
            for name, front in (("nginx", nginx), ("nginx-tls", tls)):
                log.info("%s", affinity.pin_and_report(name, front.process.pid, server_cpus))
            log.info("server and nginx on cores %s, perf_analyzer on %s", server_cpus, load_cpus)
            by_system = runs(server, nginx, tls, pki.ca, data, load_cpus, args.measurement_ms)
            triton_pid = server.process.pid
            for r in range(args.rounds):
                order = SYSTEMS[r % len(SYSTEMS) :] + SYSTEMS[: r % len(SYSTEMS)]
                for level in levels:
                    for system in order:
                        nginx_pid = (tls if system in PLAIN else nginx).process.pid
                        began = (time.monotonic(), *map(cpu_seconds, (nginx_pid, triton_pid)))
                        point = pa.measure(by_system[system], level)
                        ended = (time.monotonic(), *map(cpu_seconds, (nginx_pid, triton_pid)))
                        wall, nginx_cpu, triton_cpu = (
                            b - a for a, b in zip(began, ended, strict=True)
                        )
                        share = (nginx_cpu / wall, 1000 * triton_cpu / wall / point.throughput)
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
                            100 * share[0],
                            share[1],
                        )
    print(
        "\nsystem      c     texts/s (rounds)        p99 ms (rounds)         ÷ triton"
        "  nginx  tritonserver ms/text (medians)"
    )
    for level in levels:
        for system in SYSTEMS:
            base_points = points[(BASE.get(system, "triton"), level)]
            base = statistics.median(p.throughput for p in base_points)
            got = points[(system, level)]
            rate = statistics.median(p.throughput for p in got)
            rates = ", ".join(f"{p.throughput:.1f}" for p in got)
            p99s = ", ".join(f"{p.p99_ms:.1f}" for p in got)
            nginx_share = statistics.median(s[0] for s in shares[(system, level)])
            per_text = statistics.median(s[1] for s in shares[(system, level)])
            print(
                f"{system:11s} {level:<5d} {rates:23s} {p99s:23s} {rate / base:5.2f}x"
                f"  {100 * nginx_share:4.1f}%  {per_text:.2f}"
            )
    print("\nTLS ÷ plain, texts/s (medians over rounds; the same gateway config but TLS)")
    for system, plain in PLAIN.items():
        for level in levels:
            got, base = (
                statistics.median(p.throughput for p in points[(s, level)]) for s in (system, plain)
            )
            print(f"{system:15s} c={level:<4d} {got / base:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
