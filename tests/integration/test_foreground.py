"""The launcher as a user runs it: ``python -m server`` and failed starts, on a real server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from client.classify import ClassifyClient
from export import samples
from processes import managed
from server import launcher, stubs
from server.launcher import Server, ServerConfig, ServerStartError
from tests.helpers import REPO, RERUN_KNOWN_ABORT, known_abort_raised

pytestmark = pytest.mark.integration


BROKEN_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights file is corrupt (deliberate test failure)")

    def execute(self, requests):
        return []
"""


def test_a_model_that_fails_to_load_gives_a_clear_error_with_the_log(tmp_path):
    model = tmp_path / "broken"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(BROKEN_MODEL)
    (model / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU, count: 1 } ]\n"
    )
    config = ServerConfig(model_repository=tmp_path, http_port=0, grpc_port=0, metrics_port=0)
    server = Server(config, log_path=tmp_path / "server.log")
    started = time.monotonic()
    with pytest.raises(ServerStartError) as failure:
        server.start(timeout=60)
    message = str(failure.value)
    assert "exited" in message and "broken" in message
    assert "weights file is corrupt" in message
    assert time.monotonic() - started < 30, "a failed load is reported early, not at the timeout"
    assert server.process.poll() is not None


def test_foreground_server_prints_endpoints_and_stops_on_ctrl_c(classifier_onnx):
    key = "from-the-environment-not-printed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--http-port=0", "--grpc-port=0", "--metrics-port=0"],
        cwd=REPO,
        env={**os.environ, launcher.ADMIN_KEY_ENV: key},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "server exited early:\n" + "".join(lines)
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        output = "".join(lines)
        assert "HTTP     http://127.0.0.1:" in output
        assert "gRPC     127.0.0.1:" in output and "metrics  http://127.0.0.1:" in output
        assert "admin    model-repository, shared-memory, logging, trace need header " in output
        assert "'admin-key: $TRITON_ADMIN_KEY'" in output and key not in output
        assert "stubs    a dead one gets its model reloaded" in output
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest
    assert "stopped (exit status 0)" in rest and key not in rest


@pytest.mark.flaky(**RERUN_KNOWN_ABORT)
def test_foreground_server_reloads_a_model_whose_stub_died(classifier_onnx):
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "server", "--http-port=0", "--grpc-port=0", "--metrics-port=0"),
            # Room to unload every model's stubs on a busy core: the clean exit is asserted.
            *("--", "--exit-timeout-secs=10"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    binary = launcher.find_installation().binary

    def read_until(text: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "server exited early:\n" + "".join(lines)
            lines.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} within {seconds} s:\n" + "".join(lines))

    try:
        read_until("Ctrl-C stops it", 120)
        (triton,) = (p for p in managed.children(proc.pid) if managed.argv(p)[:1] == [str(binary)])
        (victim,) = stubs.stub_pids(triton, "postprocess")
        with known_abort_raised(lambda: "".join(lines)):
            os.kill(victim, signal.SIGKILL)  # idle: no request in flight
            read_until("postprocess reloaded in", 60)
        (new,) = stubs.stub_pids(triton, "postprocess")
        url = "".join(lines).split("HTTP     http://")[1].split("/")[0]
        with ClassifyClient(url) as client:
            result = client.classify([samples.photo_bytes("chelsea")])
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines)
    assert f"stub of postprocess/1 (pid {victim}) died; reloading postprocess" in output
    assert new != victim and result
    # A stub that died idle leaves nothing behind: the server stops cleanly (one that dies
    # mid-request leaves an instance that never unloads: tests/integration/test_faults.py).
    assert proc.returncode == 0 and "stopped (exit status 0)" in rest, rest
