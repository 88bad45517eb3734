"""Stopping by signal is always clean: ``python -m server`` and ``make serve``, at any moment.

Ten starts, each signalled at another moment: before tritonserver runs, while its models
load, right after it is ready, under load, and twice in a row. Each time, the launcher and
every tritonserver and stub it started are gone within 15 s of the first signal, the launcher
exits without a traceback, and nothing is left in /dev/shm. A second Ctrl-C while the launcher
stops a running tritonserver kills it at once rather than waiting for its drain: the launcher
reports the SIGKILL as tritonserver's exit status and still exits 0. ``make serve`` gets its
Ctrl-C as a terminal sends it: to the whole process group.

Each moment is reached by waiting for what marks it (the launcher's interpreter running its
own code, its ``starting`` log line, its ready banner, answered requests), and the phase the
launcher was in when the signal went out is read at that instant and checked: a moment that
missed its phase would test another one twice.
"""

from __future__ import annotations

import contextlib
import itertools
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

import psutil
import pytest

from client.embed import EmbedClient
from processes import guard
from server.stubs import STUB_NAME
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


# The phases a signal can hit, as read from the launcher at that instant (``Launch.phase``):
BEFORE_IMPORT = "before import"  # still the shell's exec wrapper: the launcher's Python not yet
IMPORTING = "importing"  # the launcher's interpreter, before its signal handlers are installed
SET_UP = "set up"  # handlers installed, tritonserver not started yet (a few milliseconds)
LOADING = "loading"  # tritonserver started (the ``starting`` line), the ready banner not yet
READY = "ready"  # the ready banner printed
UNDER_LOAD = "under load"  # ready, and requests answered before the signal
STOPPING = "stopping"  # a first signal was sent, the launcher still runs
# ... and it has said it stops tritonserver (its "stopping tritonserver" line), which still runs.
STOPPING_SERVER = "stopping tritonserver"
EXITED = "exited"  # the launcher is gone already
# Requests the load must have had answered before an "under load" signal.
LOAD_ANSWERED = 5


@dataclass(frozen=True)
class Moment:
    """When to signal a start, relative to an event of the launch, and how."""

    label: str
    after_s: float  # seconds after ``anchor``
    phases: tuple[str, ...]  # the phase the first signal must hit (one of these)
    # launch: the process started; exec: the launcher's interpreter runs (the wrapper has
    # exec'd it); starting: the launcher logged tritonserver's command line; stub: the first
    # Python-backend stub of the start runs (a model is loading); ready: its banner.
    anchor: str = "launch"
    second_after_s: float | None = None  # a second signal this much later (while stopping)
    second_phase: str = STOPPING  # the phase the second signal must hit
    first: signal.Signals = signal.SIGTERM
    second: signal.Signals = signal.SIGINT
    under_load: bool = False  # from ready, LOAD_ANSWERED requests answered, then ``after_s``
    make: bool = False  # through `make serve`, the signals sent to its process group


MOMENTS = [
    Moment("before tritonserver runs", 0.05, (BEFORE_IMPORT, IMPORTING), first=signal.SIGINT),
    Moment("launcher importing", 0.05, (IMPORTING,), anchor="exec"),
    # Early in the loading of the models, and late: once the first model's stub runs.
    Moment("models loading +0.3s", 0.3, (LOADING,), anchor="starting"),
    Moment("models loading, a stub up", 0.0, (LOADING,), anchor="stub"),
    Moment("models loading, twice", 0.0, (LOADING,), anchor="stub", second_after_s=0.03),
    Moment("at ready", 0.0, (READY,), anchor="ready"),
    Moment(
        "while stopping, twice",
        0.5,
        (READY,),
        anchor="ready",
        second_after_s=1.0,
        second_phase=STOPPING_SERVER,
    ),
    Moment("under load", 0.0, (UNDER_LOAD,), anchor="ready", under_load=True),
    Moment("make serve, Ctrl-C", 0.5, (READY,), anchor="ready", first=signal.SIGINT, make=True),
    Moment(
        "make serve, Ctrl-C while loading",
        0.0,
        (LOADING,),
        anchor="stub",
        first=signal.SIGINT,
        make=True,
    ),
]


def started_by(mark: str) -> set[int]:
    """Pids of live (not zombie) processes of the start marked ``mark``."""
    found = set()
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARK) == mark and guard.running(process.pid):
                found.add(process.pid)
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    return found


def command_line(pid: int) -> list[str]:
    """argv of a process ([] once it is gone)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether the process has a handler of its own for ``sig`` (SigCgt in /proc).

    psutil does not read the signal masks; /proc/<pid>/status has them.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return bool(mask >> (sig - 1) & 1)


def is_launcher(argv: list[str]) -> bool:
    return argv[1:3] == ["-m", "server"]


def tritonserver_runs(mark: str) -> bool:
    """Whether a tritonserver of the start marked ``mark`` runs (not a zombie)."""
    return any(
        Path((command_line(pid) or [""])[0]).name == "tritonserver" for pid in started_by(mark)
    )


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
        self.starting = threading.Event()
        self.ready = threading.Event()
        self.http_url: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if re.match(r"starting \S*tritonserver ", line):
                self.starting.set()
            found = re.search(r"HTTP +http://([\d.]+:\d+)/", line)
            if found:
                self.http_url = found.group(1)
                self.ready.set()

    def launcher_pid(self) -> int | None:
        """The pid of ``python -m server`` once the wrapper has exec'd it (make: its child)."""
        if not self.moment.make:
            return self.process.pid if is_launcher(command_line(self.process.pid)) else None
        return next((p for p in started_by(self.mark) if is_launcher(command_line(p))), None)

    def wait_for_launcher(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.launcher_pid() is None:
            if time.monotonic() > deadline or self.process.poll() is not None:
                return False
            time.sleep(0.002)
        return True

    def wait_for_stub(self, timeout: float) -> bool:
        """Wait until a Python-backend stub of this start runs."""
        deadline = time.monotonic() + timeout
        while not any(
            command_line(p)[:1] and command_line(p)[0].endswith(STUB_NAME)
            for p in started_by(self.mark)
        ):
            if time.monotonic() > deadline or self.process.poll() is not None:
                return False
            time.sleep(0.005)
        return True

    def phase(self, load: Load | None) -> str:
        """What the launcher is doing right now (one of the phases above)."""
        if self.process.poll() is not None:
            return EXITED
        if self.ready.is_set():
            return UNDER_LOAD if load is not None and load.answered > 0 else READY
        if self.starting.is_set():
            return LOADING
        pid = self.launcher_pid()
        if pid is None:
            return BEFORE_IMPORT
        return SET_UP if catches(pid, signal.SIGTERM) else IMPORTING

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
        self.numbers = itertools.count()
        self.answered = 0  # requests that got their embedding back
        self.errors: list[tuple[float, str]] = []  # (monotonic time, error) that ended a client
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        try:
            with EmbedClient(self.url, protocol="http") as client:
                while not self.stopping.is_set():
                    n = next(self.numbers)
                    client.embed([f"request number {n} while the server stops"])
                    with self.lock:
                        self.answered += 1
        except Exception as exc:  # noqa: BLE001 - the server going away ends the load
            self.errors.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))

    def wait_answered(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.answered < count and time.monotonic() < deadline and not self.errors:
            time.sleep(0.01)

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=10)


def run_one(moment: Moment) -> dict:
    launch = Launch(moment)
    load = None
    if moment.anchor == "launch":
        time.sleep(max(0.0, moment.after_s - (time.monotonic() - launch.started)))
    elif moment.anchor == "exec":
        assert launch.wait_for_launcher(30), launch.output
        time.sleep(moment.after_s)
    elif moment.anchor == "starting":
        assert launch.starting.wait(300), launch.output  # make serve may export first
        time.sleep(moment.after_s)
    elif moment.anchor == "stub":
        assert launch.starting.wait(300), launch.output
        assert launch.wait_for_stub(60), launch.output
        time.sleep(moment.after_s)
    else:
        assert launch.ready.wait(120), launch.output
        if moment.under_load:
            load = Load(launch.http_url)
            load.wait_answered(LOAD_ANSWERED, timeout=60)
        time.sleep(moment.after_s)
    # What the signal hits, read just before it is sent.
    phase, answered = launch.phase(load), load.answered if load else 0
    signalled = time.monotonic()
    launch.signal(moment.first)
    second_phase = None
    if moment.second_after_s is not None:
        time.sleep(moment.second_after_s)
        if launch.process.poll() is not None:
            second_phase = EXITED
        elif "stopping tritonserver" in launch.output and tritonserver_runs(launch.mark):
            second_phase = STOPPING_SERVER
        else:
            second_phase = STOPPING
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
        "phase": phase,
        "second_phase": second_phase,
        "answered": answered,
        # Errors that ended a load client before the signal: the load was not answered.
        "load_errors": [e for t, e in (load.errors if load else []) if t < signalled],
    }


def test_a_signal_at_any_moment_stops_the_server_and_everything_it_started():
    regions_before = shm_regions()
    results = [run_one(moment) for moment in MOMENTS]
    for r in results:
        print(
            f"{r['moment']:38s} hit {r['phase']:>13s} {r['second_phase'] or '':>21s}"
            f"  exit {r['returncode']!s:>4}  launcher gone {r['exited_s']:5.2f} s"
            f"  all gone {r['all_gone_s']:5.2f} s  answered {r['answered']}"
        )
    assert len(results) == len(MOMENTS)
    # Every signal hit the phase its moment is about, and every second one a launcher that was
    # still stopping; the load was answered (and failed nowhere) before its signal.
    missed = {
        moment.label: (r["phase"], r["second_phase"])
        for moment, r in zip(MOMENTS, results, strict=True)
        if r["phase"] not in moment.phases
        or r["second_phase"] != (None if moment.second_after_s is None else moment.second_phase)
    }
    assert not missed, f"phase hit (first, second signal) off its moment: {missed}"
    under_load = [(m, r) for m, r in zip(MOMENTS, results, strict=True) if m.under_load]
    assert len(under_load) == 1
    assert all(r["answered"] >= LOAD_ANSWERED and not r["load_errors"] for _, r in under_load), [
        (m.label, r["answered"], r["load_errors"]) for m, r in under_load
    ]
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
    # A second signal while tritonserver drains kills it at once (SIGKILL: status -9) instead
    # of waiting out the drain, and the launcher still stops cleanly. Only a killed tritonserver
    # reports -9: one that stops on the first signal reports 0.
    for r in (r for r in results if r["second_phase"] == STOPPING_SERVER):
        context = f"{r['moment']}:\n{r['output'][-3000:]}"
        assert "stopped (exit status -9)" in r["output"], context
        assert r["returncode"] == 0, context
    # Nothing left in /dev/shm: every region made meanwhile is gone or mapped by a live process
    # (another server on this machine; the starts here are all gone, checked above).
    assert not guard.orphan_regions(shm_regions() - regions_before)
