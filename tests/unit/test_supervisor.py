"""The stub supervisor's bookkeeping, on real processes that look like Python-backend stubs.

A "stub" here is a copy of ``cat`` named ``triton_python_backend_stub`` whose first argument is
``<repository>/<model>/<version>/model.py`` (a FIFO, so it blocks), started by this test process
as tritonserver starts its stubs: killed and not waited for, it stays a zombie child, exactly
what a dead stub is under tritonserver. The reload is recorded instead of sent; the real one,
against a real server, is in tests/integration/test_faults.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from processes import managed
from server import container, supervisor
from server.launcher import ServerConfig
from server.stubs import STUB_NAME, stub_model
from tests.helpers import REPO


@pytest.fixture
def stubs(tmp_path):
    """``start(model)`` runs one fake stub of ``model``; all are killed and reaped at the end."""
    binary = tmp_path / STUB_NAME
    shutil.copy(shutil.which("cat"), binary)
    started: list[subprocess.Popen] = []

    def start(model: str) -> subprocess.Popen:
        model_file = tmp_path / "repository" / model / "1" / "model.py"
        model_file.parent.mkdir(parents=True, exist_ok=True)
        if not model_file.exists():
            os.mkfifo(model_file)
        started.append(subprocess.Popen([str(binary), str(model_file)]))
        return started[-1]

    yield start
    for p in started:
        p.kill()
        p.wait()


def kill_unreaped(p: subprocess.Popen) -> None:
    """SIGKILL without wait(): the process stays a zombie of this one, as a dead stub does."""
    os.kill(p.pid, 9)
    deadline = time.monotonic() + 5
    while managed.state(p.pid) != supervisor.ZOMBIE:
        assert time.monotonic() < deadline, "the killed process never became a zombie"
        time.sleep(0.01)


def watching_us(reloads: list) -> supervisor.StubSupervisor:
    return supervisor.StubSupervisor(
        os.getpid(), "unused:0", reload=lambda model, pid: reloads.append((model, pid))
    )


def test_a_stub_that_died_gets_its_model_reloaded_once(stubs):
    tokenize, postprocess = stubs("tokenize"), stubs("postprocess")
    reloads: list = []
    watcher = watching_us(reloads)
    assert watcher.poll() == []
    assert stub_model(tokenize.pid) == ("tokenize", "1")
    kill_unreaped(tokenize)
    assert watcher.poll() == []  # one sighting could be an unload in progress
    (revival,) = watcher.poll()
    assert (revival.model, revival.version, revival.dead_pid) == ("tokenize", "1", tokenize.pid)
    assert revival.error is None and reloads == [("tokenize", tokenize.pid)]
    # The zombie lingers (tritonserver reaps it only if the old instance ever unloads): once.
    assert watcher.poll() == [] and watcher.poll() == []
    assert reloads == [("tokenize", tokenize.pid)] and postprocess.poll() is None


def test_a_stub_reaped_at_once_is_an_unload_not_a_death(stubs):
    stub = stubs("postprocess")
    reloads: list = []
    watcher = watching_us(reloads)
    watcher.poll()
    stub.kill()
    stub.wait()  # reaped, as tritonserver does when it unloads a model
    assert watcher.poll() == [] and watcher.poll() == [] and reloads == []


def test_a_zombie_seen_once_then_reaped_is_not_revived(stubs):
    stub = stubs("postprocess")
    reloads: list = []
    watcher = watching_us(reloads)
    watcher.poll()
    kill_unreaped(stub)
    watcher.poll()
    stub.wait()
    assert watcher.poll() == [] and reloads == []


def test_a_stub_never_seen_alive_is_left_alone(stubs):
    encoder = stubs("encoder")
    kill_unreaped(encoder)
    reloads: list = []
    watcher = watching_us(reloads)
    assert watcher.poll() == [] and watcher.poll() == [] and reloads == []


def test_a_failed_reload_is_reported_and_polling_goes_on(stubs):
    tokenize = stubs("tokenize")

    def refuse(model, pid):
        raise RuntimeError("explicit model load / unload is not allowed")

    watcher = supervisor.StubSupervisor(os.getpid(), "unused:0", reload=refuse)
    watcher.poll()
    kill_unreaped(tokenize)
    watcher.poll()
    (revival,) = watcher.poll()
    assert "not allowed" in revival.error and watcher.revivals == [revival]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], ["--model-control-mode=explicit", "--load-model=*"]),
        (
            ["--log-verbose=1"],
            ["--model-control-mode=explicit", "--load-model=*", "--log-verbose=1"],
        ),
        (["--model-control-mode=explicit", "--load-model=embed"], None),  # kept as given
        (["--model-control-mode", "explicit"], None),
    ],
)
def test_explicit_control_is_added_or_kept(args, expected):
    assert supervisor.explicit_control(args) == (expected if expected is not None else args)


@pytest.mark.parametrize("args", [["--model-control-mode=poll"], ["--model-control-mode", "none"]])
def test_another_control_mode_means_no_supervisor(args):
    assert supervisor.explicit_control(args) is None


def test_the_container_supervises_unless_told_not_to():
    config = ServerConfig(extra_args=["--log-verbose=1"])
    assert container.add_supervision(config, {})
    assert config.extra_args[:2] == ["--model-control-mode=explicit", "--load-model=*"]
    off = ServerConfig(extra_args=["--log-verbose=1"])
    assert not container.add_supervision(off, {"TRITON_STUB_SUPERVISOR": "0"})
    assert off.extra_args == ["--log-verbose=1"]
    polling = ServerConfig(extra_args=["--model-control-mode=poll"])
    assert not container.add_supervision(polling, {})
    assert polling.extra_args == ["--model-control-mode=poll"]


def test_the_supervisor_module_runs_as_a_command():
    # What the container starts before it execs tritonserver: it must at least parse and stop
    # by itself when the process it watches is gone.
    gone = subprocess.Popen(["true"])
    gone.wait()
    result = subprocess.run(
        [sys.executable, "-m", "server.supervisor", "--pid", str(gone.pid), "--interval", "0.05"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
