"""Launch a real ``tritonserver`` over model_repository/, here or inside the NGC container.

Where the binary comes from decides the environment:

* the NGC container: ``tritonserver`` on PATH (``/opt/tritonserver``), native backends present;
* here: the tritonserver 2.51.0 bundled in the ``nvidia-pytriton`` wheel, which has the Python
  backend but no onnxruntime backend, so models are served with ``--model-config-name=local``.

The launcher wires what the bundled server needs (the Python-backend stub for this interpreter,
``PATH`` and ``LD_LIBRARY_PATH`` so the stub runs this virtualenv's Python, backend and cache
directories), picks free ports if asked, waits for readiness and stops the server cleanly.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from packaging.version import Version

from paths import MODEL_REPOSITORY
from pipelines import text_cache
from processes.managed import ManagedProcess, ServerStartError, free_port
from server import gpus as gpu_info
from server import repository, tracing

__all__ = [
    "ADMIN_APIS",
    "ADMIN_KEY_ENV",
    "Server",
    "ServerConfig",
    "ServerStartError",
    "find_installation",
    "free_port",
]

log = logging.getLogger(__name__)

NGC_ROOT = Path("/opt/tritonserver")

# Endpoints that change the server or reach into the host: model load/unload and the repository
# index, shared-memory registration (the server maps a region a client names), log and trace
# settings. Left open: health, metadata and inference (the service itself), model-config and
# statistics (read-only; perf_analyzer and the monitoring read them).
ADMIN_APIS = ("model-repository", "shared-memory", "logging", "trace")
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
ADMIN_HEADER = "admin-key"
# Triton's gRPC endpoint matches restricted-protocol keys under this metadata prefix (2.51:
# "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'").
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
# Header-safe and free of the ':' ',' '=' that separate the parts of Triton's flag.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9._~-]{16,}")
_SECRETS: set[str] = set()  # admin keys in use in this process


class _RedactKeys(logging.Filter):
    """Masks admin keys in the command lines the launcher and the container log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _SECRETS and record.args:
            record.msg, record.args = record.getMessage(), ()
        for key in _SECRETS:
            record.msg = str(record.msg).replace(key, "***")
        return True


for _name in ("processes.managed", "server.container"):
    logging.getLogger(_name).addFilter(_RedactKeys())


# The tritonserver inside each nvidia-pytriton release we know (its own docs name the NGC one).
BUNDLED_SERVER_VERSIONS = {"0.7.0": "2.51.0"}
# Python-backend stubs before 2.52 (python_backend r24.10 and older) are built with pybind11
# 2.10, which reads numpy 2's dtype structure as numpy 1's: BYTES inputs arrive corrupt and the
# stub aborts ("unpack_from requires a buffer of at least 3806520038 bytes"; python_backend
# PR #384, first in r24.11 = 2.52.0).
FIRST_SERVER_FOR_NUMPY_2 = Version("2.52")


def stub_numpy_problem(server_version: str | None, numpy_version: str) -> str | None:
    """Why a tritonserver's Python backend cannot run with this numpy (None: it can)."""
    if server_version is None or Version(server_version) >= FIRST_SERVER_FOR_NUMPY_2:
        return None
    if Version(numpy_version).major < 2:
        return None
    return (
        f"numpy {numpy_version} in {sys.prefix} cannot serve Python models on tritonserver "
        f"{server_version}: its Python-backend stub is built for numpy 1 and corrupts BYTES "
        "inputs under numpy 2 (fixed in tritonserver 2.52). Install numpy<2 in this "
        "environment: pip install 'numpy<2'"
    )


@dataclass(frozen=True)
class Installation:
    """Where one tritonserver lives and what it has."""

    binary: Path
    backend_dir: Path
    cache_dir: Path
    bundled: bool  # the PyPI (nvidia-pytriton) build rather than the NGC container

    @property
    def version(self) -> str | None:
        """The tritonserver version, None when unknown.

        NGC images set $TRITON_SERVER_VERSION; the bundled build's comes from its wheel.
        """
        if os.environ.get("TRITON_SERVER_VERSION"):
            return os.environ["TRITON_SERVER_VERSION"]
        if self.bundled:
            import importlib.metadata

            try:
                wheel = importlib.metadata.version("nvidia-pytriton")
            except importlib.metadata.PackageNotFoundError:
                return None  # the build copied without its wheel (the GPU check's bundle)
            return BUNDLED_SERVER_VERSIONS.get(wheel)
        return None

    def has_backend(self, name: str) -> bool:
        """True if ``backends/<name>`` exists (e.g. onnxruntime, tensorrt, python)."""
        return (self.backend_dir / name).is_dir()

    def supports(self, flag: str) -> bool:
        """True if this tritonserver's ``--help`` lists ``flag`` (``--http-max-input-size``)."""
        return flag in _help_text(self.binary)


@functools.cache
def _help_text(binary: Path) -> str:
    # tritonserver prints its usage on stderr; one call per binary and process (a process start).
    done = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
    return done.stdout + done.stderr


def _bundled_root() -> Path | None:
    # Located, not imported: pytriton's own Python API needs packages we do not install.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent / "tritonserver"
    return root if (root / "bin" / "tritonserver").exists() else None


def find_installation() -> Installation:
    """Locate tritonserver: $TRITONSERVER_BIN, then PATH / NGC, then the PyPI-bundled build.

    Raises:
        FileNotFoundError: none was found.
    """
    explicit = os.environ.get("TRITONSERVER_BIN")
    on_path = shutil.which("tritonserver")
    for candidate in (explicit, on_path, NGC_ROOT / "bin" / "tritonserver"):
        if candidate and Path(candidate).exists():
            root = Path(candidate).resolve().parent.parent
            return Installation(Path(candidate), root / "backends", root / "caches", bundled=False)
    root = _bundled_root()
    if root is None:
        raise FileNotFoundError(
            "no tritonserver found: set TRITONSERVER_BIN, run inside the NGC container, "
            "or `pip install --no-deps nvidia-pytriton==0.7.0` (make venv does this)"
        )
    return Installation(root / "bin" / "tritonserver", root / "backends", root / "caches", True)


def install_python_stub(inst: Installation) -> Path:
    """Put the Python-backend stub for this interpreter beside ``libtriton_python.so``.

    The wheel keeps one stub per Python version elsewhere; the backend only looks next to
    itself. Same directory depth, so the stub's RPATH to ``nvidia_pytriton.libs`` resolves.
    """
    target = inst.backend_dir / "python" / "triton_python_backend_stub"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = inst.binary.parent.parent / "python_backend_stubs" / version / target.name
    if not source.exists():
        raise FileNotFoundError(f"no Python-backend stub for Python {version} at {source}")
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        shutil.copy2(source, target)
        target.chmod(0o755)
    return target


def numpy_version() -> str:
    """The numpy this environment imports (what the Python-backend stub runs with)."""
    import importlib.metadata

    return importlib.metadata.version("numpy")


def libpython() -> Path | None:
    """This interpreter's shared libpython (libpython3.X.so.1.0), None if it has none."""
    name = sysconfig.get_config_var("INSTSONAME")
    path = Path(sysconfig.get_config_var("LIBDIR") or "") / (name or "")
    return path if name and path.is_file() else None


def detect_environment(inst: Installation, gpus: list[gpu_info.Gpu] | None = None) -> str | None:
    """The ``--model-config-name`` for this machine.

    * ``local``: no onnxruntime backend (the bundled server), no GPU;
    * ``gpu-local``: the bundled server on a GPU machine (PyTorch on the GPU in Python models);
    * ``gpu``: native backends and a GPU (TensorRT engines; ``gpu-ort`` is the alternative);
    * None: native backends on CPU (config.pbtxt).
    """
    gpus = gpu_info.discover() if gpus is None else gpus
    if not inst.has_backend("onnxruntime"):
        return "gpu-local" if gpus else "local"
    return "gpu" if gpus else None


# A value in tritonserver's --cache-config cannot hold the "," and "=" that separate its parts.
_CACHE_VALUE = re.compile(r"[^,=\s]+")


def redis_cache_args(url: str, timeout_ms: int = 20) -> list[str]:
    """``--cache-config`` flags of Triton's redis_cache for a ``redis://`` URL.

    Its options (the redis_cache README): host, port, user, password, db, connect_timeout and
    socket_timeout in milliseconds. It knows no TLS in 2.51, so a ``rediss://`` URL is refused;
    the password travels on tritonserver's command line (Triton reads it nowhere else), and
    the launcher's log hides it.

    Raises:
        ValueError: not ``redis://``, or a value Triton's flag cannot carry.
    """
    parts = urlsplit(url)
    if parts.scheme != "redis" or not parts.hostname:
        raise ValueError(
            f"Triton's redis_cache takes redis://[user:password@]host:port[/db], not {url.split(':')[0]}://"
        )
    options = {"host": parts.hostname, "port": str(parts.port or 6379)}
    if parts.username:
        options["user"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
        _SECRETS.add(options["password"])
    if parts.path.strip("/"):
        options["db"] = parts.path.strip("/")
    options["connect_timeout"] = options["socket_timeout"] = str(timeout_ms)
    for key, value in options.items():
        if not _CACHE_VALUE.fullmatch(value):
            raise ValueError(f"Triton's redis_cache {key} cannot hold ',', '=' or spaces")
    return [f"--cache-config=redis,{key}={value}" for key, value in options.items()]


@dataclass
class ServerConfig:
    """How to run one server. Ports of 0 are replaced by free ones at start."""

    model_repository: Path = MODEL_REPOSITORY
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_config_name: str | None = "auto"
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    cpus: list[int] | None = None  # pin the server (and its Python stubs) to these cores
    # Triton's local response cache; models opt in with `response_cache { enable: true }`.
    cache_bytes: int = 256 * 1024 * 1024
    # Triton's own redis_cache instead of the local one (the NGC image has it; the PyPI build
    # does not): whole responses shared by every replica, under this redis:// URL.
    response_cache_url: str | None = None
    response_cache_timeout_ms: int = 20
    # GPU configs (configs/gpu*.pbtxt): instances per GPU (None: each config's own count).
    instances_per_gpu: int | None = None
    # TensorRT engines built for this machine: (model, version) → plan file.
    engines: dict[tuple[str, str], Path] = field(default_factory=dict)
    # Admin endpoints (ADMIN_APIS) answer only requests that carry this key, over HTTP and gRPC
    # (Triton's --http-restricted-api / --grpc-restricted-protocol). None: $TRITON_ADMIN_KEY,
    # else a random key made when the Server is created. An empty tuple leaves them open.
    admin_key: str | None = None
    restricted_apis: tuple[str, ...] = ADMIN_APIS
    # Largest HTTP request body, passed as --http-max-input-size where the server has that flag
    # (releases after 2.51; 2.51 has no body limit, so the models bound what they parse).
    max_input_bytes: int = 64 * 1024 * 1024
    # The Redis that the embedding step's per-text cache shares with other replicas (its URL,
    # password included, reaches the stubs through the environment, never a command line).
    text_cache_url: str | None = None
    # Every config here is complete and checked against Triton's schema (tests/unit/
    # test_configs.py). With auto-complete on, the Python backend starts one more stub per
    # model only to call auto_complete_config (python_be.cc, ModelState::Create): a start of
    # every model took 3x as long (docs/processes.md#start-up-time).
    auto_complete_config: bool = False
    # Latency quantiles per model from the server itself (nv_inference_request_summary_us and
    # the queue and compute summaries; p50, p90 and p99 over Triton's sliding window): the
    # dashboards' per-model p99. What they cost: docs/performance.md#latency-summaries-2026-12-04.
    summary_latencies: bool = True
    summary_quantiles: str = "0.5:0.05,0.9:0.01,0.99:0.001"  # quantile:allowed error
    # OpenTelemetry traces of the server and its Python steps (server.tracing); None: off.
    trace: tracing.TraceSettings | None = None


class Server(ManagedProcess):
    """A tritonserver process. Use as a context manager, or call start() and stop().

    Raises ValueError at creation for an admin key that cannot travel in Triton's flag.
    """

    name = "tritonserver"

    def __init__(self, config: ServerConfig | None = None, log_path: Path | None = None):
        super().__init__(log_path)
        # A copy: the ports, environment and key chosen here are this server's, and one
        # ServerConfig may start several servers (each with free ports of its own).
        self.config = copy.deepcopy(config) if config is not None else ServerConfig()
        self.installation = find_installation()
        self.gpus = gpu_info.discover()
        if self.config.model_config_name == "auto":
            self.config.model_config_name = detect_environment(self.installation, self.gpus)
        if self.config.restricted_apis:
            key = (
                self.config.admin_key or os.environ.get(ADMIN_KEY_ENV) or secrets.token_urlsafe(24)
            )
            if not _KEY_PATTERN.fullmatch(key):
                raise ValueError(
                    "admin key: at least 16 characters from A-Z a-z 0-9 . _ ~ - "
                    f"(it travels in a header and in tritonserver's {ADMIN_HEADER}=<key> flag)"
                )
            self.config.admin_key = key
            _SECRETS.add(key)
        # What tritonserver loads: the repository itself, or for GPU configs a linked copy
        # whose instance groups name this machine's GPUs (made in prepare()).
        self.repository = self.config.model_repository
        self._materialized: Path | None = None

    # Endpoints -----------------------------------------------------------------------------
    @property
    def host(self) -> str:
        """The address it binds (its config's)."""
        return self.config.host

    @property
    def http_url(self) -> str:
        """host:port of the HTTP endpoint (what tritonclient.http expects)."""
        return self.address(self.config.http_port)

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC endpoint."""
        return self.address(self.config.grpc_port)

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics endpoint."""
        return f"http://{self.address(self.config.metrics_port)}/metrics"

    @property
    def ready_url(self) -> str:
        """/v2/health/ready: 200 once the server and every model are ready."""
        return f"http://{self.http_url}/v2/health/ready"

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that open the restricted admin endpoints (``headers=`` of tritonclient calls).

        Args:
            protocol: ``http`` or ``grpc``; Triton expects the key under different names.

        Returns:
            One header with the key, or an empty dict when nothing is restricted.
        """
        c = self.config
        if not c.restricted_apis:
            return {}
        name = ADMIN_HEADER if protocol == "http" else GRPC_HEADER_PREFIX + ADMIN_HEADER
        return {name: c.admin_key}

    # Process -------------------------------------------------------------------------------
    def command(self) -> list[str]:
        """The full tritonserver command line."""
        c = self.config
        args = [
            str(self.installation.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.installation.backend_dir}",
            f"--cache-directory={self.installation.cache_dir}",
            f"--http-address={c.host}",
            f"--http-port={c.http_port}",
            f"--grpc-address={c.host}",
            f"--grpc-port={c.grpc_port}",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
            f"--log-verbose={c.log_verbose}",
        ]
        if c.response_cache_url:
            args += redis_cache_args(c.response_cache_url, c.response_cache_timeout_ms)
        elif c.cache_bytes:
            args.append(f"--cache-config=local,size={c.cache_bytes}")
        if c.model_config_name:
            args.append(f"--model-config-name={c.model_config_name}")
        if c.summary_latencies:
            args += [
                "--metrics-config=summary_latencies=true",
                f"--metrics-config=summary_quantiles={c.summary_quantiles}",
            ]
        if not c.auto_complete_config:
            args.append("--disable-auto-complete-config")
        if c.restricted_apis:
            rule = f"{','.join(c.restricted_apis)}:{ADMIN_HEADER}={c.admin_key}"
            args += [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]
        if c.trace is not None:
            args += c.trace.server_args()
        if c.max_input_bytes and self.installation.supports("--http-max-input-size"):
            args.append(f"--http-max-input-size={c.max_input_bytes}")
        args += list(c.extra_args)
        if c.cpus:
            # Affinity is inherited by the Python-backend stub processes too.
            args = ["taskset", "-c", ",".join(map(str, c.cpus)), *args]
        return args

    def environment(self) -> dict[str, str]:
        """Environment for the server, so the Python stub runs this interpreter's packages."""
        env = dict(os.environ)
        if self.installation.bundled:
            # The stub finds its Python through `python3` on PATH and must load the matching
            # libpython (Debian's system one would otherwise win).
            bindir = str(Path(sys.executable).parent)
            env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
            libdir = sysconfig.get_config_var("LIBDIR") or ""
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p
            )
        if self.installation.has_backend("onnxruntime") and (shared := libpython()):
            # embed_graph's tokenizer op library (onnxruntime-extensions from PyPI) is built as
            # a Python extension: loading it needs Python's C API symbols, which tritonserver
            # lacks (dlopen: "undefined symbol: PyInstanceMethod_Type"; it loads with libpython
            # preloaded). The stubs link this libpython anyway.
            env["LD_PRELOAD"] = " ".join(p for p in (str(shared), env.get("LD_PRELOAD")) if p)
        # Stubs would write __pycache__ into the model folders as they load, and 2.51 takes a
        # model whose folder changed after its load for modified: the next load of an ensemble
        # would reload every step (docs/triton-2.51.md), and unloading several Python
        # instances at once is where 2.51 has been seen to abort.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        # onnxruntime 1.32 uploads usage telemetry from a thread of every process that opens a
        # session, and its exit waits on that upload: where DNS goes unanswered (a container
        # with no route out) each stub's exit took 7 s, a stop 10-15 s
        # (docs/processes.md#what-a-stop-guarantees). A server does not phone home unasked.
        env.setdefault("ORT_DISABLE_TELEMETRY", "1")
        for name in tracing.STEP_VARIABLES:
            env.pop(name, None)
        if self.config.trace is not None:
            env.update(self.config.trace.environment())
        env.pop(text_cache.URL_ENV, None)
        if self.config.text_cache_url:
            env[text_cache.URL_ENV] = self.config.text_cache_url
        # No PYTHONPATH: the stub imports pipelines from its environment's site-packages, where
        # it is installed (from Python 3.11 the stub ignores PYTHONPATH anyway).
        return env

    def prepare(self) -> None:
        """Pick free ports where asked (0) and install the Python-backend stub if needed."""
        c = self.config
        for name in ("http_port", "grpc_port", "metrics_port"):
            setattr(c, name, self.port_or_free(getattr(c, name)))
        if self.installation.has_backend("python"):
            # The stub imports the numpy of this environment (python3 on PATH): check it first.
            problem = stub_numpy_problem(self.installation.version, numpy_version())
            if problem:
                raise ServerStartError(problem)
        if self.installation.bundled and self.installation.has_backend("python"):
            install_python_stub(self.installation)
        if (c.model_config_name or "").startswith("gpu"):
            target = Path(tempfile.mkdtemp(prefix="triton-repository-"))
            self._materialized = target
            self.repository = repository.materialize(
                c.model_repository,
                target,
                c.model_config_name,
                self.gpus,
                c.instances_per_gpu,
                c.engines,
            )

    def cleanup(self) -> None:
        """Remove the linked repository copy that ``prepare`` made for GPU configs."""
        if self._materialized is not None:
            shutil.rmtree(self._materialized, ignore_errors=True)
            self._materialized = None
