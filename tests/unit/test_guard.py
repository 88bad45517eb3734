"""The guard process: nothing a managed server started outlives it or the program that owns it.

A stand-in server plays tritonserver's part without Triton: a group leader that answers HTTP
readiness and forks a child that ignores SIGTERM and maps a shared-memory file named like a
Python-backend stub's region (as a real stub does), and inherits the leader's listening socket.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from processes import guard
from processes.managed import ManagedProcess
from server.launcher import free_port

STAND_IN = textwrap.dedent(
    """
    import http.server, mmap, os, signal, sys, time
    port, region = int(sys.argv[1]), sys.argv[2]

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", port), Ready)
    print("stand-in listening on", port, flush=True)
    if os.fork() == 0:  # the "stub": ignores SIGTERM like triton_python_backend_stub
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        fd = os.open(region, os.O_CREAT | os.O_RDWR, 0o600)
        os.ftruncate(fd, 4096)
        mapped = mmap.mmap(fd, 4096)
        while True:
            time.sleep(1)
    httpd.serve_forever()
    """
)

OWNER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from tests.unit.test_guard import StandIn
    server = StandIn(sys.argv[2]).start(timeout=30)
    print(server.process.pid, flush=True)
    time.sleep(600)
    """
)


class StandIn(ManagedProcess):
    """A server with one SIGTERM-deaf child that maps a stub-like shared-memory region."""

    name = "stand-in"
    guard_grace_s = 2.0

    def __init__(self, region: str, log_path: Path | None = None):
        super().__init__(log_path)
        self.region = Path(region)
        self.port = free_port()

    def command(self) -> list[str]:
        return [sys.executable, "-c", STAND_IN, str(self.port), str(self.region)]

    @property
    def ready_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def wait_for_child(self) -> int:
        """The child's pid, once it has mapped its region."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            members = [p for p in guard.group_members(self.process.pid) if p != self.process.pid]
            if members and guard.shm_regions(members):
                return members[0]
            time.sleep(0.05)
        raise AssertionError("the stand-in's child never mapped its region")


@pytest.fixture
def region():
    path = Path(f"{guard.SHM_PREFIX}_test-{uuid.uuid4()}")
    yield path
    path.unlink(missing_ok=True)


def wait_until(condition, timeout: float) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_clean_stop_releases_the_guard_and_leaves_nothing(region):
    server = StandIn(str(region)).start(timeout=30)
    guard_process = server._guard
    child = server.wait_for_child()
    log_path = server.log_path
    assert server.stop(timeout=5) == -signal.SIGTERM
    # The SIGTERM-deaf child was swept with its region; the guard has gone.
    assert not guard.running(child) and not region.exists()
    assert guard_process.poll() is not None
    assert not log_path.exists()  # a clean stop removes its temp log


def test_a_server_that_dies_has_its_orphans_swept_at_once(region):
    server = StandIn(str(region))
    # A long grace, so that "at once" and "after the grace" are far apart: a sweep at once
    # comes within a poll or two of the guard (guard.POLL_S), a guard that gave the dead
    # leader the grace first (as it does when the owner dies) comes after guard_grace_s.
    server.guard_grace_s = 40 * guard.POLL_S
    server.start(timeout=30)
    child = server.wait_for_child()
    # The leader dies and nobody reaps it: the orphan would keep its sockets and run on.
    os.kill(server.process.pid, signal.SIGKILL)
    took = wait_until(
        lambda: not guard.running(child) and not region.exists(),
        timeout=server.guard_grace_s + 5,
    )
    # Half the grace is 20 polls: room for a slow, busy machine, and less than a guard that
    # waited the grace would take.
    assert took < server.guard_grace_s / 2, took
    server.stop()


def test_an_owner_killed_outright_takes_its_server_with_it(region):
    repo = Path(__file__).resolve().parents[2]
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(repo), str(region)], stdout=subprocess.PIPE, text=True
    )
    leader = int(owner.stdout.readline())
    wait_until(lambda: guard.shm_regions(guard.group_members(leader)), timeout=10)
    members = guard.group_members(leader)
    assert len(members) == 2
    owner.kill()
    owner.wait()
    # SIGTERM to the leader, then after the grace (2 s here) SIGKILL for the deaf child.
    took = wait_until(lambda: not any(guard.running(p) for p in members), timeout=15)
    assert took < StandIn.guard_grace_s + 3
    assert not region.exists()


def test_a_start_that_fails_keeps_its_log_and_says_where(tmp_path, caplog):
    class NeverReady(StandIn):
        @property
        def ready_url(self) -> str:
            return f"http://127.0.0.1:{free_port()}/"

    server = NeverReady(str(tmp_path / "unused"))
    with pytest.raises(Exception, match="not ready"):
        server.start(timeout=1)
    assert server.log_path.exists() and str(server.log_path) in caplog.text
    assert not guard.running(server.process.pid)
    server.log_path.unlink()


def test_a_server_never_started_leaves_no_file():
    before = set(Path(tempfile.gettempdir()).glob("stand-in-*.log"))
    server = StandIn("/dev/shm/unused")
    server.stop()
    assert set(Path(tempfile.gettempdir()).glob("stand-in-*.log")) == before
