"""A server subprocess: its log file, an HTTP readiness probe, its addresses, and a clean stop.

Shared by the tritonserver launcher, nginx, redis-server and the benchmark's peer servers.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from processes import guard

log = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """The server exited or did not become ready; the message carries its log tail."""


def client_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=64)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``, and none of the last ones given here.

    The kernel may give a released port to the next bind; a server takes three ports at once
    (HTTP, gRPC, metrics), which must differ.
    """
    held: list[socket.socket] = []
    try:
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)  # kept bound until the end: the next bind gets another port
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if port not in _RECENT_PORTS:
                _RECENT_PORTS.append(port)
                return port
    finally:
        for sock in held:
            sock.close()


class StartInterruptedError(Exception):
    """A stop was requested (a signal) while the process was starting; it has been stopped."""


class StopRequests:
    """Counts SIGINT/SIGTERM without taking a lock, so a handler can never deadlock.

    A handler that calls ``threading.Event.set()`` can block for ever: it runs in the main
    thread between two bytecodes, possibly while that thread holds the same Event's lock inside
    ``wait()``. Counting is all a handler does here; the code that waits polls ``count``.
    """

    def __init__(self) -> None:
        self.count = 0

    def install(self, signals=(signal.SIGINT, signal.SIGTERM)) -> StopRequests:
        """Make these signals count here (main thread only).

        Also where the program was started with them ignored (a shell starts a background job
        with SIGINT ignored): a SIGINT sent to this program always stops it.
        """
        for sig in signals:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.count += 1


GUARD_SCRIPT = Path(guard.__file__)


class ManagedProcess:
    """Subclasses give ``command()``, ``ready_url`` and optionally ``environment()``/``prepare()``.

    Use as a context manager, or call ``start()`` and ``stop()``. The process runs in a process
    group of its own (with whatever it starts), watched by a guard process (``processes/guard.py``)
    that stops the group if this program dies and sweeps it if the process itself dies.

    Without ``log_path`` the log goes to a temp file made at start; a clean stop removes it, a
    failed start or exit keeps it and logs where it is.
    """

    name = "server"
    host = "127.0.0.1"  # the address it binds; subclasses set their own
    poll_interval = 0.25
    # Seconds the guard gives the process to stop on SIGTERM once its owner is gone.
    guard_grace_s = 10.0

    def __init__(self, log_path: Path | None = None):
        self.process: subprocess.Popen | None = None
        self._own_log = log_path is None
        self.log_path = log_path
        self._guard: subprocess.Popen | None = None
        self._failed = False
        self._stopped = False
        self._regions_before: set[Path] = set()

    def command(self) -> list[str]:
        """The command line to run."""
        raise NotImplementedError

    def address(self, port: int) -> str:
        """``host:port`` where a client on this machine reaches ``port`` (tritonclient's form)."""
        return f"{client_host(self.host)}:{port}"

    def port_or_free(self, port: int) -> int:
        """``port``, or one free right now on ``host`` where it is 0."""
        return port or free_port(client_host(self.host))

    @property
    def ready_url(self) -> str:
        """A URL that answers 200 once the server is ready."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """Environment of the process (default: ours)."""
        return dict(os.environ)

    def prepare(self) -> None:
        """Called before launching (pick ports, install files)."""

    def cleanup(self) -> None:
        """Called after the process has stopped (remove what ``prepare`` made)."""

    def start(
        self,
        timeout: float = 120.0,
        cwd: Path | None = None,
        stop_requests: StopRequests | None = None,
    ):
        """Start the process and wait until ``ready_url`` answers 200.

        Args:
            timeout: seconds to wait for readiness.
            cwd: working directory of the process.
            stop_requests: signals counted meanwhile; one stops the start.

        Raises:
            ServerStartError: the process exited or was not ready within ``timeout``; the
                message ends with the tail of its log.
            StartInterruptedError: ``stop_requests`` counted a signal; the process has been stopped.
        """
        self._regions_before = guard.all_regions()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        try:
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
                    # Its own session: a Ctrl-C reaches only us, and we stop it cleanly. The
                    # group is what the guard and stop() sweep.
                    start_new_session=True,
                )
            self._guard = subprocess.Popen(
                [sys.executable, "-I", "-S", str(GUARD_SCRIPT), *self._guard_args()],
                stdin=subprocess.PIPE,
                start_new_session=True,
            )
            self.wait_ready(timeout, stop_requests)
        except StartInterruptedError:
            self.stop(stop_requests=stop_requests)
            raise
        except BaseException:
            self._failed = True
            self.stop(stop_requests=stop_requests)
            raise
        return self

    def _guard_args(self) -> list[str]:
        return [str(self.process.pid), str(self.guard_grace_s)]

    # For an https ``ready_url``: how the probe checks the process's certificate (None: as
    # urllib does, against the system's CAs).
    ready_context: ssl.SSLContext | None = None

    def _ready_status(self, timeout_s: float) -> int | None:
        """The HTTP status ``ready_url`` answers within ``timeout_s``; None if nothing answers."""
        try:
            with urllib.request.urlopen(
                self.ready_url, timeout=timeout_s, context=self.ready_context
            ) as response:
                return response.status
        except urllib.error.HTTPError as error:  # an answer, only not a 2xx one
            return error.code
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def is_ready(self, timeout_s: float = 2.0) -> bool:
        """True if ``ready_url`` answers 200 within ``timeout_s``."""
        return self._ready_status(timeout_s) == 200

    def answers(self, timeout_s: float = 2.0) -> bool:
        """True if ``ready_url`` answers at all within ``timeout_s``, ready or not: not hung."""
        return self._ready_status(timeout_s) is not None

    def wait_ready(self, timeout: float, stop_requests: StopRequests | None = None) -> None:
        """Poll readiness until ``timeout``; fail early if the process exits or a stop comes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if stop_requests is not None and stop_requests.count:
                raise StartInterruptedError(f"{self.name}: stop requested during start-up")
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"{self.name} exited with status {self.process.returncode} before it was "
                    f"ready.\n{self.log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(self.poll_interval)
        raise ServerStartError(f"{self.name} not ready after {timeout:.0f} s.\n{self.log_tail()}")

    def running(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except (OSError, AttributeError):
            return f"(no {self.name} log)"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def stop(self, timeout: float = 30.0, stop_requests: StopRequests | None = None) -> int | None:
        """SIGTERM (the server drains in-flight requests), SIGKILL if it does not exit in time.

        Whatever else of its process group still runs afterwards (a stub whose server died)
        is killed, and the shared memory it leaves is removed. Calling it again is harmless.

        Args:
            timeout: seconds to wait after SIGTERM before SIGKILL.
            stop_requests: a signal counted after this call began (a second Ctrl-C) kills at
                once.

        Returns:
            The exit status (None if the process never started).
        """
        if self._stopped:
            return None if self.process is None else self.process.returncode
        self._stopped = True
        if self.process is None:  # prepare() or Popen failed
            self._finish(None)
            return None
        pgid = self.process.pid
        regions: set[Path] = set()
        if self.process.poll() is None:
            regions = shm_regions_of_group(pgid)
            seen = stop_requests.count if stop_requests is not None else 0
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.process.poll() is None:
                hurried = stop_requests is not None and stop_requests.count > seen
                if hurried or time.monotonic() > deadline:
                    if not hurried:
                        log.warning("%s did not stop within %.0f s; killing it", self.name, timeout)
                    self.kill()
                    break
                time.sleep(0.05)
        status = self.process.returncode
        guard.sweep(pgid)
        # An error exit (e.g. an instance that never unloaded after its stub died), or a stop in
        # the middle of loading, leaves stubs' shared memory behind: remove what this server
        # had mapped, and what appeared while it ran that nothing maps any more.
        for region in guard.orphan_regions(regions | (guard.all_regions() - self._regions_before)):
            with contextlib.suppress(FileNotFoundError):
                region.unlink()
        self._release_guard()
        self._finish(status)
        return status

    def kill(self) -> float:
        """SIGKILL the process and everything it started (as a crash would); returns when.

        A killed tritonserver cannot unlink its Python-backend stubs' shared-memory regions, so
        the ones its process group had mapped are removed here (only those: other servers on
        the machine keep theirs).
        """
        pid = self.process.pid
        regions = shm_regions_of_group(pid)
        # Taken before the signal: a client can see the crash before killpg has even returned.
        killed = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        self.process.wait()
        guard.sweep(pid, regions)
        return killed

    def _release_guard(self) -> None:
        if self._guard is None:
            return
        # The guard may have gone already (it exits once the leader has): nothing to tell it.
        with contextlib.suppress(BrokenPipeError, OSError):
            self._guard.stdin.write(b"released")
            self._guard.stdin.close()
        try:
            self._guard.wait(5)
        except subprocess.TimeoutExpired:
            self._guard.kill()
            self._guard.wait()
        self._guard = None

    def _finish(self, status: int | None) -> None:
        """Remove temp files after a clean run; keep the log of a failed one and say where."""
        self.cleanup()
        if not self._own_log or self.log_path is None or not self.log_path.exists():
            return
        # 0, or death by the SIGTERM stop() sent (what uvicorn re-raises after a clean stop).
        kept = self._failed or status not in (0, None, -signal.SIGTERM)
        if kept and self.log_path.stat().st_size:
            log.warning("%s log kept: %s", self.name, self.log_path)
        else:
            self.log_path.unlink()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self._failed = True
        self.stop()


def shm_regions_of_group(pgid: int) -> set[Path]:
    """/dev/shm files mapped by the processes of one process group (a server and its stubs)."""
    return guard.shm_regions(guard.group_members(pgid))


# Other processes --------------------------------------------------------------------------
def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Python-backend stubs are children of tritonserver)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:  # gone, or not ours to read
        return []


def argv(pid: int) -> list[str]:
    """The process's arguments ([] if it is gone)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def state(pid: int) -> str | None:
    """The process's status (``psutil.STATUS_ZOMBIE`` for a zombie...), None if it is gone."""
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return None


class HttpProcess(ManagedProcess):
    """A server on one HTTP port (0: a free one at start), ready when ``ready_path`` answers."""

    ready_path = "/v2/health/ready"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, log_path: Path | None = None):
        super().__init__(log_path)
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        """host:port, as perf_analyzer's ``-u`` and tritonclient expect."""
        return self.address(self.port)

    @property
    def ready_url(self) -> str:
        """``ready_path`` on that port."""
        return f"http://{self.url}{self.ready_path}"

    def prepare(self) -> None:
        """Pick a free port if asked (0)."""
        self.port = self.port_or_free(self.port)
