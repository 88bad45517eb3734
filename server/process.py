"""A server subprocess: its log file, an HTTP readiness probe, and a clean stop.

Shared by the tritonserver launcher and the benchmark's peer server.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """The server exited or did not become ready; the message carries its log tail."""


def client_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


class ManagedProcess:
    """Subclasses give ``command()``, ``ready_url`` and optionally ``environment()``/``prepare()``.

    Use as a context manager, or call ``start()`` and ``stop()``.
    """

    name = "server"
    poll_interval = 0.25

    def __init__(self, log_path: Path | None = None):
        self.process: subprocess.Popen | None = None
        self._own_log = log_path is None
        self.log_path = log_path or Path(tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")[1])

    def command(self) -> list[str]:
        """The command line to run."""
        raise NotImplementedError

    @property
    def ready_url(self) -> str:
        """A URL that answers 200 once the server is ready."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """Environment of the process (default: ours)."""
        return dict(os.environ)

    def prepare(self) -> None:
        """Called before launching (pick ports, install files)."""

    def start(self, timeout: float = 120.0, cwd: Path | None = None):
        """Start the process and wait until ``ready_url`` answers 200.

        Raises:
            ServerStartError: the process exited or was not ready within ``timeout``; the
                message ends with the tail of its log.
        """
        self.prepare()
        command = self.command()
        log.info("starting %s", " ".join(command))
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                # Its own session: a Ctrl-C reaches only us, and we stop it cleanly.
                start_new_session=True,
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self) -> bool:
        """True if ``ready_url`` answers 200."""
        try:
            with urllib.request.urlopen(self.ready_url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_ready(self, timeout: float) -> None:
        """Poll readiness until ``timeout``; fail early if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"{self.name} exited with status {self.process.returncode} before it was "
                    f"ready.\n{self.log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(self.poll_interval)
        raise ServerStartError(f"{self.name} not ready after {timeout:.0f} s.\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no {self.name} log)"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the server drains in-flight requests), SIGKILL if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        regions = shm_regions_of_group(self.process.pid)
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", self.name, timeout)
            self.kill()
            return self.process.returncode
        if status != 0:
            # A server that exits with an error (e.g. an instance that never unloaded after its
            # stub died) leaves its stubs' shared memory behind: only its own is removed.
            for region in regions:
                with contextlib.suppress(FileNotFoundError):
                    region.unlink()
        return status

    def kill(self) -> float:
        """SIGKILL the process and everything it started (as a crash would); returns when.

        A killed tritonserver cannot unlink its Python-backend stubs' shared-memory regions, so
        the ones its process group had mapped are removed here (only those: other servers on
        the machine keep theirs).
        """
        pid = self.process.pid
        regions = shm_regions_of_group(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        killed = time.monotonic()
        self.process.wait()
        for region in regions:
            with contextlib.suppress(FileNotFoundError):
                region.unlink()
        return killed

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_log and exc[0] is None:
            self.log_path.unlink(missing_ok=True)


def shm_regions_of_group(pgid: int) -> set[Path]:
    """/dev/shm files mapped by the processes of one process group (a server and its stubs)."""
    found: set[Path] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            maps = (entry / "maps").read_text()
        except (OSError, ProcessLookupError):
            continue
        for line in maps.splitlines():
            path = line.split()[-1]
            if path.startswith("/dev/shm/triton_python_backend_shm_region"):
                found.add(Path(path))
    return found


# Python-backend stubs --------------------------------------------------------------------
STUB_NAME = "triton_python_backend_stub"


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Python-backend stubs are children of tritonserver)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the ppid follows the last ")".
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def argv(pid: int) -> list[str]:
    """The process's arguments ([] if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def stub_model(pid: int) -> tuple[str, str] | None:
    """(model, version) served by a Python-backend stub process, None for any other process.

    The stub's first argument is its model file, ``<repository>/<model>/<version>/model.py``.
    Only that argument is looked at: the rest of the command line holds other paths (the
    backend directory, the repository's own folders) that could contain a model's name.
    """
    args = argv(pid)
    if len(args) < 2 or not args[0].endswith(STUB_NAME):
        return None
    parts = Path(args[1]).parts
    return (parts[-3], parts[-2]) if len(parts) >= 3 else None


def stub_pids(server_pid: int, model: str | None = None) -> list[int]:
    """Python-backend stub processes of a server, optionally only those of one model."""
    pids = []
    for pid in children(server_pid):
        served = stub_model(pid)
        if served is not None and (model is None or served[0] == model):
            pids.append(pid)
    return pids


def state(pid: int) -> str | None:
    """The process's state letter from /proc (``R``, ``S``, ``Z`` for a zombie...), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]
