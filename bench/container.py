"""What the container costs: the same load on make serve's tritonserver and on the CPU image.

``python -m bench.container`` builds the CPU image (containers.images, as ``make up`` does),
then measures three servers of the same repository and configs, one after the other, each held
to the same cores, perf_analyzer on the other core:

* ``serve``: the tritonserver that ``make serve`` runs, started here;
* ``host``: the CPU image with ``--network host`` (its ports on this host's loopback);
* ``port``: the CPU image on Docker's bridge with its ports published on 127.0.0.1
  (``-p``: docker-proxy carries every connection).

``embed`` (one text per request) and ``classify`` (one JPEG) over gRPC, at each concurrency,
with the response cache and embed's per-text cache off (perf_analyzer repeats its inputs).
Systems are interleaved within each round, so a busy machine slows each alike; the table gives
each one's rate and p99, and its median ratio to ``serve``::

    .venv/bin/python -m bench.container --rounds 2 --levels 1,16
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import tritonclient.grpc as grpcclient

from bench.harness import affinity, compare, variants
from containers import images, tools
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding
from processes.managed import free_port
from server import Server, ServerConfig
from server.launcher import ADMIN_KEY_ENV

log = logging.getLogger(__name__)

SYSTEMS = ("serve", "host", "port")
MODELS = (embedding.ENSEMBLE, classification.ENSEMBLE)
CONFIG_NAME = "local"  # what both the bundled server and the CPU image serve
# No model at start: the embedding step is loaded first with its per-text cache off (a Python
# step is never reloaded: docs/triton-2.51.md), then the ensembles with the response cache off.
EXPLICIT = "--model-control-mode=explicit"


def load_computed_path(grpc_url: str, admin_key: str) -> None:
    """Load both services with every cache off, on a server started with no model."""
    headers = {"triton-grpc-protocol-admin-key": admin_key}
    with grpcclient.InferenceServerClient(grpc_url) as client:
        variants.without_text_cache(client, MODEL_REPOSITORY, CONFIG_NAME, headers)
        variants.set_response_cache(client, MODELS, False, MODEL_REPOSITORY, CONFIG_NAME, headers)


def wait_live(http_url: str, timeout_s: float = 120) -> None:
    """Until the server answers its liveness endpoint."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{http_url}/v2/health/live", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def container(network: str, cpus: list[int], admin_key: str) -> Iterator[tuple[str, str]]:
    """The CPU image on ``host`` networking or a published ``port``: (HTTP, gRPC) host:port."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    command = [tools.docker(), "run", "-d", "--rm", "--shm-size=256m"]
    command += [f"--cpuset-cpus={','.join(map(str, cpus))}"]
    # The stub supervisor off, as for the server started here (Server starts none).
    command += ["-e", f"{ADMIN_KEY_ENV}={admin_key}", "-e", "TRITON_STUB_SUPERVISOR=0"]
    args = [EXPLICIT]
    if network == "host":
        command += ["--network", "host"]
        # Later flags win over the entrypoint's own: loopback, on free ports of this host.
        args += [f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"]
        args += [f"--{kind}-address=127.0.0.1" for kind in ("http", "grpc", "metrics")]
    else:
        command += ["-p", f"127.0.0.1:{http}:8000", "-p", f"127.0.0.1:{grpc}:8001"]
    name = subprocess.run(
        [*command, images.TRITON_IMAGE, *args], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        urls = (f"127.0.0.1:{http}", f"127.0.0.1:{grpc}")
        wait_live(urls[0])
        yield urls
    finally:
        subprocess.run([tools.docker(), "stop", "-t", "30", name], capture_output=True)


@contextlib.contextmanager
def computed_path_server(cpus: list[int], **settings) -> Iterator[Server]:
    """A server of ``make serve``'s configs on ``cpus``, both services loaded, every cache off.

    ``settings``: the ``ServerConfig`` fields a benchmark changes (the thing it measures).
    """
    key = secrets.token_urlsafe(24)
    config = ServerConfig(
        http_port=0, grpc_port=0, metrics_port=0, cpus=cpus, admin_key=key, **settings
    )
    config.extra_args = [EXPLICIT]
    with Server(config) as server:
        load_computed_path(server.grpc_url, key)
        yield server


def computed_path_system(cpus: list[int], **settings) -> compare.System:
    """``computed_path_server`` as a system of ``compare.interleaved`` (its gRPC host:port)."""

    @contextlib.contextmanager
    def run():
        with computed_path_server(cpus, **settings) as running:
            yield running.grpc_url

    return run


@contextlib.contextmanager
def system(name: str, cpus: list[int]) -> Iterator[tuple[str, str]]:
    """One server of the comparison, every cache off: its (HTTP, gRPC) host:port."""
    if name == "serve":
        with computed_path_server(cpus) as server:
            yield server.http_url, server.grpc_url
    else:
        key = secrets.token_urlsafe(24)
        with container(name, cpus, key) as urls:
            load_computed_path(urls[1], key)
            yield urls


def main(argv: list[str] | None = None) -> int:
    """Print rate and p99 per system, model, level and round, and the ratios to ``serve``."""
    args = compare.arguments(
        argv,
        __doc__,
        "python -m bench.container --rounds 2 --levels 1,16",
        (2, "1,16", 4000),
        lambda p: p.add_argument(
            "--from", dest="source", default="auto", choices=["auto", "registry", "debian"]
        ),
    )
    levels = args.levels
    started = tools.start_engine()
    if started.returncode != 0:
        print(started.stderr, file=sys.stderr)
        return 1
    images.build_all(args.source)
    server_cpus, load_cpus = affinity.split()
    log.info("servers on cores %s, perf_analyzer on %s", server_cpus, load_cpus)

    def grpc_of(name: str) -> compare.System:
        @contextlib.contextmanager
        def run():
            with system(name, server_cpus) as (_, grpc_url):
                yield grpc_url

        return run

    systems = {name: grpc_of(name) for name in SYSTEMS}
    points = compare.interleaved(
        systems, MODELS, levels, args.rounds, args.measurement_ms, load_cpus
    )
    print()
    print(compare.table(points, SYSTEMS, MODELS, levels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
