"""The launcher: finding the server, wiring its environment, clear failures, clean stops."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from client.classify import ClassifyClient
from pipelines import samples
from server import __main__ as server_cli
from server import launcher, process
from server.launcher import ADMIN_APIS, Server, ServerConfig, ServerStartError
from tests.helpers import RERUN_KNOWN_ABORT, known_abort_raised

REPO = Path(__file__).resolve().parents[2]


def test_finds_the_bundled_server_and_picks_the_local_configs():
    inst = launcher.find_installation()
    assert inst.binary.name == "tritonserver" and os.access(inst.binary, os.X_OK)
    assert inst.has_backend("python")
    if inst.bundled:
        assert not inst.has_backend("onnxruntime")
        assert launcher.detect_environment(inst) == "local"


def test_stub_is_installed_beside_the_backend():
    inst = launcher.find_installation()
    if not inst.bundled:
        pytest.skip("only the PyPI build needs its stub copied")
    stub = launcher.install_python_stub(inst)
    assert stub.parent == inst.backend_dir / "python" and os.access(stub, os.X_OK)


def test_command_and_environment_are_wired():
    server = Server(
        ServerConfig(http_port=1234, host="127.0.0.1", extra_args=["--exit-timeout-secs=5"])
    )
    cmd = server.command()
    assert f"--backend-directory={server.installation.backend_dir}" in cmd
    assert f"--cache-directory={server.installation.cache_dir}" in cmd
    assert "--http-address=127.0.0.1" in cmd and "--http-port=1234" in cmd
    assert "--model-config-name=local" in cmd or not server.installation.bundled
    assert cmd[-1] == "--exit-timeout-secs=5"
    env = server.environment()
    if server.installation.bundled:
        assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
        assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == sysconfig.get_config_var("LIBDIR")


def test_admin_apis_are_restricted_by_default_with_a_fresh_key(monkeypatch):
    monkeypatch.delenv(launcher.ADMIN_KEY_ENV, raising=False)
    one, two = Server(), Server()
    key = one.config.admin_key
    assert len(key) >= 32 and key != two.config.admin_key
    rule = f"model-repository,shared-memory,logging,trace:admin-key={key}"
    cmd = one.command()
    assert f"--http-restricted-api={rule}" in cmd and f"--grpc-restricted-protocol={rule}" in cmd
    assert one.admin_headers() == {"admin-key": key}
    assert one.admin_headers("grpc") == {"triton-grpc-protocol-admin-key": key}
    assert ServerConfig().host == "127.0.0.1"


def test_admin_key_comes_from_the_config_then_the_environment(monkeypatch):
    monkeypatch.setenv(launcher.ADMIN_KEY_ENV, "from-the-environment-0123")
    assert Server().config.admin_key == "from-the-environment-0123"
    chosen = Server(ServerConfig(admin_key="chosen-key-0123456789"))
    assert "--http-restricted-api=" + ",".join(ADMIN_APIS) + ":admin-key=chosen-key-0123456789" in (
        chosen.command()
    )


@pytest.mark.parametrize("key", ["short", "has:colon-and-more-chars", "has=equals-and-more-chars"])
def test_a_key_that_would_break_the_flag_or_header_is_rejected(key):
    with pytest.raises(ValueError, match="admin key"):
        Server(ServerConfig(admin_key=key))


def test_open_admin_apis_send_no_restriction_and_need_no_header():
    server = Server(ServerConfig(restricted_apis=()))
    assert not any("restricted" in arg for arg in server.command())
    assert server.admin_headers() == {} and server.admin_headers("grpc") == {}


def test_the_key_is_masked_in_the_logged_command_line(caplog):
    server = Server(ServerConfig(admin_key="never-in-the-log-0123456789"))
    with caplog.at_level(logging.INFO, logger="server.process"):
        logging.getLogger("server.process").info("starting %s", " ".join(server.command()))
    assert "never-in-the-log" not in caplog.text
    assert "admin-key=*** " in caplog.text


def test_body_limit_is_passed_only_to_servers_that_know_the_flag():
    server = Server()
    inst = server.installation
    assert inst.supports("--http-restricted-api") and inst.supports("--grpc-restricted-protocol")
    flag = f"--http-max-input-size={64 * 1024 * 1024}"
    assert (flag in server.command()) == inst.supports("--http-max-input-size")
    if inst.bundled:
        assert not inst.supports("--http-max-input-size")  # 2.51 has no body limit


def test_command_line_of_python_m_server():
    args = server_cli.parse_args([])
    assert args.host == "127.0.0.1" and args.admin_key is None and not args.open_admin_apis
    assert server_cli.parse_args(["--open-admin-apis"]).open_admin_apis
    assert server_cli.parse_args(["--admin-key", "k" * 20]).admin_key == "k" * 20
    with pytest.raises(SystemExit):
        server_cli.parse_args(["--admin-key", "k" * 20, "--open-admin-apis"])


def test_free_ports_are_distinct_and_bindable():
    ports = {launcher.free_port() for _ in range(5)}
    assert len(ports) >= 4 and all(1024 < p < 65536 for p in ports)


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


def test_foreground_server_prints_a_key_it_made_once():
    server = Server(ServerConfig(admin_key="made-at-start-0123456789"))
    line = server_cli._admin_line(server, None)
    assert line.count("made-at-start-0123456789") == 1
    assert "'admin-key: made-at-start-0123456789'" in line
    assert "OPEN" in server_cli._admin_line(Server(ServerConfig(restricted_apis=())), None)


@pytest.mark.flaky(**RERUN_KNOWN_ABORT)
def test_foreground_server_reloads_a_model_whose_stub_died(classifier_onnx):
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "server", "--http-port=0", "--grpc-port=0", "--metrics-port=0"),
            *("--", "--exit-timeout-secs=3"),
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
        (triton,) = (p for p in process.children(proc.pid) if process.argv(p)[:1] == [str(binary)])
        (victim,) = process.stub_pids(triton, "postprocess")
        with known_abort_raised(lambda: "".join(lines)):
            os.kill(victim, signal.SIGKILL)  # idle: no request in flight
            read_until("postprocess reloaded in", 60)
        (new,) = process.stub_pids(triton, "postprocess")
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
