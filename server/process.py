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
