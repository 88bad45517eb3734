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

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
NGC_ROOT = Path("/opt/tritonserver")


class ServerStartError(RuntimeError):
    """tritonserver exited or did not become ready; the message carries its log tail."""


@dataclass(frozen=True)
class Installation:
    """Where one tritonserver lives and what it has."""

    binary: Path
    backend_dir: Path
    cache_dir: Path
    bundled: bool  # the PyPI (nvidia-pytriton) build rather than the NGC container

    def has_backend(self, name: str) -> bool:
        """True if ``backends/<name>`` exists (e.g. onnxruntime, tensorrt, python)."""
        return (self.backend_dir / name).is_dir()


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


def detect_environment(inst: Installation) -> str | None:
    """The ``--model-config-name`` for this machine: local, gpu, or None (config.pbtxt)."""
    if not inst.has_backend("onnxruntime"):
        return "local"
    if os.environ.get("CUDA_VISIBLE_DEVICES", "") not in ("", "-1") or shutil.which("nvidia-smi"):
        return "gpu"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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


class Server:
    """A tritonserver process. Use as a context manager, or call start() and stop()."""

    def __init__(self, config: ServerConfig | None = None, log_path: Path | None = None):
        self.config = config or ServerConfig()
        self.installation = find_installation()
        self.process: subprocess.Popen | None = None
        self._own_log = log_path is None
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="tritonserver-", suffix=".log")[1])
        if self.config.model_config_name == "auto":
            self.config.model_config_name = detect_environment(self.installation)

    # Endpoints -----------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        """host:port of the HTTP endpoint (what tritonclient.http expects)."""
        return f"{self._client_host}:{self.config.http_port}"

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC endpoint."""
        return f"{self._client_host}:{self.config.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics endpoint."""
        return f"http://{self._client_host}:{self.config.metrics_port}/metrics"

    @property
    def _client_host(self) -> str:
        return "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host

    # Process -------------------------------------------------------------------------------
    def command(self) -> list[str]:
        """The full tritonserver command line."""
        c = self.config
        args = [
            str(self.installation.binary),
            f"--model-repository={c.model_repository}",
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
        if c.model_config_name:
            args.append(f"--model-config-name={c.model_config_name}")
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
        # One shared copy of the project's packages, however the stub's cwd is set.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        return env

    def start(self, timeout: float = 120.0) -> Server:
        """Start the server and wait until it and all its models are ready.

        Raises:
            ServerStartError: the process exited or was not ready within ``timeout``; the message
                ends with the tail of the server log (which names the model that failed).
        """
        c = self.config
        for name in ("http_port", "grpc_port", "metrics_port"):
            if getattr(c, name) == 0:
                setattr(c, name, free_port(self._client_host))
        if self.installation.bundled and self.installation.has_backend("python"):
            install_python_stub(self.installation)
        log.info("starting %s", " ".join(self.command()))
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it cleanly
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self) -> bool:
        """True if /v2/health/ready answers 200 (server and every model ready)."""
        url = f"http://{self.http_url}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_ready(self, timeout: float) -> None:
        """Poll readiness until ``timeout``; fail early if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"tritonserver exited with status {self.process.returncode} before it was "
                    f"ready.\n{self.log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(0.25)
        raise ServerStartError(f"tritonserver not ready after {timeout:.0f} s.\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (Triton drains in-flight requests and unloads models), SIGKILL if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("tritonserver did not stop within %.0f s; killing it", timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_log and exc[0] is None:
            self.log_path.unlink(missing_ok=True)
