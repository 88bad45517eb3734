"""The containers' entrypoint: engines for this GPU, instance groups for its GPUs, tritonserver.

docker/Dockerfile: ``ENTRYPOINT ["python3", "-m", "server.container"]`` in both images; this
process execs tritonserver, so the server is PID 1's direct heir and receives the container's
signals. With no GPU it serves the CPU configs of the server it finds (``server_config``).

TensorRT engines are specific to the GPU model and the TensorRT version, so they are built here,
on the target, at the first start, into a cache volume keyed by both; later starts (and other
containers sharing the volume) reuse them. Arguments are appended to tritonserver's command line.

Environment:
    TRITON_ENGINE_CACHE        engine cache folder (default /engines, a volume)
    TRITON_MODEL_CONFIG_NAME   gpu (TensorRT plans, default) or gpu-ort (onnxruntime + TensorRT);
                               on a CPU, local (default of the CPU image), local-shed, ...
    TRITON_INSTANCES_PER_GPU   instances of each GPU model per GPU (default: each config's count)
    TRITON_CACHE_BYTES         response cache size (default 256 MiB)
    TRITON_RESPONSE_CACHE_REDIS_URL
                               redis://[:password@]host:port[/db]: Triton's own redis_cache for
                               whole responses, shared by the replicas, instead of the local one
    EMBED_TEXT_CACHE_URL       redis[s]://...: the Redis of embed's per-text cache (its step's
                               stubs read it; server/redis.py)
    TRITON_ADMIN_KEY           opens the admin endpoints (model control, repository, shared
                               memory, logging, trace) to requests carrying it; unset, they stay
                               closed (a random key that is never shown)
    TRITON_TRACE_ENDPOINT           an OTLP/HTTP endpoint (http://collector:4318/v1/traces): the
                               server's and its Python steps' OpenTelemetry spans go there
                               (server/tracing.py); unset or empty, nothing is traced
    TRITON_TRACE_RATE          trace one request in N (default 1000, Triton's)
    TRITON_TRACE_RESOURCE      resource attributes, k=v,k=v (service.version=..., deployment...)
    TRITON_STUB_SUPERVISOR     0 turns off the stub supervisor (server/supervisor.py), a process
                               of its own that reloads a model whose Python stub died; it needs
                               explicit model control, which the entrypoint then adds
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from export import tensorrt
from paths import MODEL_REPOSITORY
from pipelines import text_cache
from server import gpus as gpu_info
from server import supervisor, tracing
from server.launcher import (
    ADMIN_KEY_ENV,
    Installation,
    Server,
    ServerConfig,
    detect_environment,
    find_installation,
)

log = logging.getLogger("server.container")

ENGINE_CONFIG = "gpu"  # the config name whose models are TensorRT plans


def cache_key(gpu: gpu_info.Gpu, trt_version: str) -> str:
    """Folder of one GPU model's engines for one TensorRT version (nvidia-h200-trt10.5.0)."""
    return f"{re.sub(r'[^a-z0-9]+', '-', gpu.name.lower()).strip('-')}-trt{trt_version}"


@contextlib.contextmanager
def _locked(folder: Path):
    # Several containers may share the volume and start together: one builds, the others wait.
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_engines(
    repository: Path, cache: Path, gpus: Sequence[gpu_info.Gpu]
) -> dict[tuple[str, str], Path]:
    """Every engine the ``gpu`` configs expect, built now unless the cache has it.

    Raises:
        RuntimeError: GPUs of different models (one plan cannot serve both: pin one model with
            CUDA_VISIBLE_DEVICES), no TensorRT, or a failed build.
    """
    models = sorted({g.name for g in gpus})
    if len(models) != 1:
        raise RuntimeError(f"need GPUs of one model for one set of engines, found {models}")
    trt = tensorrt.load_tensorrt()
    if trt is None:
        raise RuntimeError(tensorrt.unavailable_reason())
    folder = cache / cache_key(gpus[0], trt.__version__)
    engines = {}
    with _locked(folder):
        for recipe in tensorrt.recipes(repository):
            plan = recipe.plan_path(folder)
            built_from = tensorrt.fingerprint(recipe, repository, trt.__version__)
            stale = cached_plan_problem(plan, built_from, recipe, repository)
            if stale is None:
                log.info("engine cached: %s", plan)
            else:
                log.info(
                    "building %s/%s (%s) on %s: %s",
                    recipe.model,
                    recipe.version,
                    recipe.precision,
                    gpus[0].name,
                    stale,
                )
                staging = plan.with_suffix(".partial")
                tensorrt.build(recipe, repository, staging, folder / "timing.cache")
                staging.rename(plan)  # a build killed halfway never looks cached
                fingerprint_path(plan).write_text(built_from)
            engines[(recipe.model, recipe.version)] = plan
    return engines


def fingerprint_path(plan: Path) -> Path:
    """Where the fingerprint of what ``plan`` was built from is kept (beside it)."""
    return plan.with_name(plan.name + ".fingerprint")


def cached_plan_problem(
    plan: Path, built_from: str, recipe: tensorrt.Recipe, repository: Path
) -> str | None:
    """Why a cached plan cannot be served (None: it can).

    It must exist, have been built from what the recipe builds from now (``fingerprint``), and
    still satisfy the config and the TensorRT backend's rules when read back.
    """
    if not plan.exists():
        return "not cached"
    marked = fingerprint_path(plan)
    if not marked.exists() or marked.read_text().strip() != built_from:
        return "cached plan built from another model, config or TensorRT"
    problems = tensorrt.check_engine(recipe.config(repository), tensorrt.read_engine(plan))
    return f"cached plan does not serve the config: {problems}" if problems else None


def server_config(
    argv: Sequence[str], environ: dict[str, str], gpus, installation: Installation
) -> ServerConfig:
    """What the container runs: all interfaces, the standard ports, the environment's knobs.

    The config name is $TRITON_MODEL_CONFIG_NAME, else what ``detect_environment`` picks for
    this server and these GPUs. A GPU config on a machine with no GPU falls back to the CPU
    configs of the server found: ``config.pbtxt`` on NGC's native backends, ``configs/local``
    on the bundled server of the CPU image (onnxruntime inside Python steps).
    """
    detected = detect_environment(installation, gpus)
    name = environ.get("TRITON_MODEL_CONFIG_NAME") or detected
    if not gpus and (name or "").startswith("gpu"):
        log.warning("no GPU visible: serving the CPU configs (%s)", detected or "config.pbtxt")
        name = detected
    per_gpu = environ.get("TRITON_INSTANCES_PER_GPU")
    return ServerConfig(
        model_repository=MODEL_REPOSITORY,
        host="0.0.0.0",
        model_config_name=name,
        instances_per_gpu=int(per_gpu) if per_gpu else None,
        cache_bytes=int(environ.get("TRITON_CACHE_BYTES", 256 * 1024 * 1024)),
        response_cache_url=environ.get("TRITON_RESPONSE_CACHE_REDIS_URL") or None,
        text_cache_url=environ.get(text_cache.URL_ENV) or None,
        trace=tracing.from_environment(environ),
        extra_args=list(argv),
    )


def add_supervision(config: ServerConfig, environ: dict[str, str]) -> bool:
    """Whether to run the stub supervisor; if so, ``config`` gets explicit model control."""
    if environ.get("TRITON_STUB_SUPERVISOR", "1") == "0":
        return False
    controlled = supervisor.explicit_control(config.extra_args)
    if controlled is None:
        log.warning("model-control mode is not explicit: no stub supervisor")
        return False
    config.extra_args = controlled
    return True


def start_supervisor(server: Server) -> subprocess.Popen:
    """The stub supervisor, started before the exec: then a child of tritonserver (this pid)."""
    command = [sys.executable, "-m", "server.supervisor", "--pid", str(os.getpid())]
    command += ["--url", server.grpc_url]
    # The key reaches it in its environment (a random one made by Server if none was given).
    return subprocess.Popen(command, env={**os.environ, ADMIN_KEY_ENV: server.config.admin_key})


def main(argv: Sequence[str] | None = None) -> int:
    """Prepare and exec tritonserver (this process becomes the server: signals reach it)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    gpus = gpu_info.discover()
    config = server_config(argv, dict(os.environ), gpus, find_installation())
    supervise = add_supervision(config, dict(os.environ))
    if config.model_config_name == ENGINE_CONFIG:
        cache = Path(os.environ.get("TRITON_ENGINE_CACHE", "/engines"))
        config.engines = ensure_engines(MODEL_REPOSITORY, cache, gpus)
    if not os.environ.get("TRITON_ADMIN_KEY"):
        log.info("TRITON_ADMIN_KEY unset: the admin endpoints stay closed")
    server = Server(config)
    server.prepare()
    command = server.command()
    if supervise:
        start_supervisor(server)
    log.info("exec %s", " ".join(command))
    os.execvpe(command[0], command, server.environment())
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
