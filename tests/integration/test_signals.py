"""Stopping by signal is always clean: ``python -m server`` and ``make serve``, at any moment.

Twenty starts, each signalled at another moment: before tritonserver runs, while its models
load, right after it is ready, under load, and twice in a row (a second Ctrl-C while it stops
kills at once). Each time, the launcher and every tritonserver and stub it started are gone
within 15 s of the first signal, the launcher exits without a traceback, and nothing is left in
/dev/shm. ``make serve`` gets its Ctrl-C as a terminal sends it: to the whole process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from client.embed import EmbedClient
from server import guard
from tests.helpers import REPO

pytestmark = pytest.mark.integration

STOP_WITHIN_S = 15.0
FREE_PORTS = ("--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")
# A terminal's shell starts a foreground command with SIGINT at its default; a test run in the
# background of a script (`cmd &`) inherits it ignored. Reset it, then exec the command.
AS_FROM_A_TERMINAL = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])",
)
# Every process of one start carries this variable with the start's own value (tritonserver,
# its stubs and the guard inherit the launcher's environment): that tells them from the rest.
MARK = "SIGNAL_TEST_START"


@dataclass(frozen=True)
class Moment:
    """When to signal a start, relative to launch or to readiness, and how."""

    label: str
    after_s: float  # seconds after launch, or after ready when ``at_ready``
    at_ready: bool = False
    second_after_s: float | None = None  # a second signal this much later
    first: signal.Signals = signal.SIGTERM
    second: signal.Signals = signal.SIGINT
    under_load: bool = False
    make: bool = False  # through `make serve`, the signals sent to its process group


MOMENTS = [
    Moment("before tritonserver runs", 0.05, first=signal.SIGINT),
    Moment("launcher importing", 0.25),
    *(Moment(f"models loading +{t}s", t) for t in (0.6, 1.0, 1.5, 2.0, 2.5, 3.0)),
    Moment("models loading, twice", 1.2, second_after_s=0.03),
    Moment("at ready", 0.0, at_ready=True),
    Moment("ready +20ms", 0.02, at_ready=True, first=signal.SIGINT),
    Moment("ready +60ms", 0.06, at_ready=True),
    Moment("at ready, SIGTERM then SIGINT 20ms", 0.0, at_ready=True, second_after_s=0.02),
    Moment("at ready, SIGTERM then SIGINT 60ms", 0.0, at_ready=True, second_after_s=0.06),
    Moment("while stopping, twice", 0.5, at_ready=True, second_after_s=1.0),
    Moment("under load", 1.0, at_ready=True, under_load=True),
    Moment("under load, twice", 1.0, at_ready=True, under_load=True, second_after_s=0.5),
    Moment("make serve, Ctrl-C", 0.5, at_ready=True, first=signal.SIGINT, make=True),
    Moment(
        "make serve, Ctrl-C twice",
        0.5,
        at_ready=True,
        first=signal.SIGINT,
        second_after_s=0.3,
        make=True,
    ),
    Moment("make serve, Ctrl-C while loading", 1.5, first=signal.SIGINT, make=True),
]


def started_by(mark: str) -> set[int]:
    """Pids of live (not zombie) processes of the start marked ``mark``."""
    needle = f"{MARK}={mark}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and guard.running(int(entry.name)):
            found.add(int(entry.name))
    return found


def shm_regions() -> set[Path]:
    return set(Path("/dev/shm").glob(Path(guard.SHM_PREFIX).name + "*"))


class Launch:
    """A launcher in a session of its own; its output is read as it comes."""

    def __init__(self, moment: Moment):
        if moment.make:
            command = ["make", "-s", "serve", f"SERVE_ARGS={' '.join(FREE_PORTS)}"]
        else:
            command = [sys.executable, "-m", "server", *FREE_PORTS]
        self.moment = moment
        self.mark = uuid.uuid4().hex
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [*AS_FROM_A_TERMINAL, *command],
            cwd=REPO,
            env={**os.environ, MARK: self.mark},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.http_url: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            found = re.search(r"HTTP +http://([\d.]+:\d+)/", line)
            if found:
                self.http_url = found.group(1)
                self.ready.set()

    def signal(self, sig: signal.Signals) -> None:
        # A terminal's Ctrl-C goes to the foreground process group: make and the launcher.
        if self.moment.make:
            os.killpg(self.process.pid, sig)
        else:
            self.process.send_signal(sig)

    @property
    def output(self) -> str:
        return "".join(self.lines)


class Load:
    """Two clients sending embed requests (new texts, so no cache hits) until stopped."""

    def __init__(self, http_url: str):
        self.url = http_url
        self.sent = 0
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        try:
            with EmbedClient(self.url, protocol="http") as client:
                while not self.stopping.is_set():
                    self.sent += 1
                    client.embed([f"request number {self.sent} while the server stops"])
        except Exception:  # noqa: BLE001 - the server going away ends the load
            return

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=10)


def run_one(moment: Moment) -> dict:
    launch = Launch(moment)
    load = None
    if moment.at_ready:
        assert launch.ready.wait(120), launch.output
        if moment.under_load:
            load = Load(launch.http_url)
        time.sleep(moment.after_s)
    else:
        time.sleep(max(0.0, moment.after_s - (time.monotonic() - launch.started)))
    signalled = time.monotonic()
    launch.signal(moment.first)
    if moment.second_after_s is not None:
        time.sleep(moment.second_after_s)
        launch.signal(moment.second)
    with contextlib.suppress(subprocess.TimeoutExpired):
        launch.process.wait(timeout=STOP_WITHIN_S)
    exited_s = time.monotonic() - signalled
    # Whatever the launcher started must be gone by the same deadline.
    while started_by(launch.mark) and time.monotonic() - signalled < STOP_WITHIN_S:
        time.sleep(0.1)
    leftover = started_by(launch.mark)
    all_gone_s = time.monotonic() - signalled
    if load:
        load.stop()
    # Leave the machine clean for the next tests: what a failure left, and the logs kept.
    if launch.process.poll() is None:
        os.killpg(launch.process.pid, signal.SIGKILL)
    for pid in sorted(leftover):
        with contextlib.suppress(ProcessLookupError):
            guard.sweep(os.getpgid(pid))
    for kept in re.findall(r"(?:log kept: |log +)(\S+\.log)", launch.output):
        Path(kept).unlink(missing_ok=True)
    return {
        "moment": moment.label,
        "exited_s": exited_s,
        "all_gone_s": all_gone_s,
        "leftover": sorted(leftover),
        "returncode": launch.process.returncode,
        "output": launch.output,
        "requests": load.sent if load else 0,
    }


def test_a_signal_at_any_moment_stops_the_server_and_everything_it_started():
    regions_before = shm_regions()
    results = [run_one(moment) for moment in MOMENTS]
    for r in results:
        print(
            f"{r['moment']:38s} exit {r['returncode']!s:>4}  launcher gone {r['exited_s']:5.2f} s"
            f"  all gone {r['all_gone_s']:5.2f} s  requests {r['requests']}"
        )
    assert len(results) == 20
    for r in results:
        context = f"{r['moment']}:\n{r['output'][-3000:]}"
        assert r["exited_s"] < STOP_WITHIN_S, context
        assert r["leftover"] == [], context
        assert r["all_gone_s"] < STOP_WITHIN_S, context
        # A SIGINT before the launcher has imported what it needs ends Python's import with
        # its usual KeyboardInterrupt (nothing was started yet); after that, no traceback.
        early = r["output"].rstrip().endswith("KeyboardInterrupt") and "starting" not in r["output"]
        assert "Traceback" not in r["output"] or early, context
        # 0: stopped; 130: interrupted start-up; 2: make after an interrupted child; -2/-15:
        # the default handlers, before the launcher installed its own (1: Python's own exit
        # after that KeyboardInterrupt).
        assert r["returncode"] in (0, 130, 2, -2, -15) or (early and r["returncode"] == 1), context
    under_load = [r for r in results if "under load" in r["moment"]]
    assert all(r["requests"] > 0 for r in under_load)
    assert shm_regions() <= regions_before
