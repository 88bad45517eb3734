"""The launcher: finding the server, wiring its environment, clear failures, clean stops."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from server import launcher
from server import serve as server_cli
from server.launcher import ADMIN_APIS, Server, ServerConfig

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


def test_the_key_is_masked_in_the_logged_command_line(tmp_path):
    # `python -m server` with a stand-in tritonserver that exits at once: the launcher logs the
    # command line it starts as it does for the real one, then reports the failed start.
    binary = tmp_path / "bin" / "tritonserver"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 3\n")
    binary.chmod(0o755)
    key = "never-in-the-log-0123456789"
    env = {**os.environ, "TRITONSERVER_BIN": str(binary)}
    env.pop(launcher.ADMIN_KEY_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "server", "--admin-key", key, "--http-port", "0", "--timeout", "20"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    for kept in re.findall(r"last \d+ lines of (\S+\.log)", output):  # a failed start keeps it
        Path(kept).unlink(missing_ok=True)
    assert done.returncode == 1 and "exited with status 3 before it was ready" in output, output
    (started,) = [line for line in output.splitlines() if line.startswith("starting ")]
    assert started.startswith(f"starting {binary} --model-repository="), started
    rule = ",".join(ADMIN_APIS) + ":admin-key=***"
    assert f" --http-restricted-api={rule} --grpc-restricted-protocol={rule}" in started, started
    assert key not in output


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
    # A server takes three at once (HTTP, gRPC, metrics): they must differ, and be free.
    ports = [launcher.free_port() for _ in range(5)]
    assert len(set(ports)) == len(ports), ports
    sockets = []
    try:
        for port in ports:  # all at once, as the server binds them
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", port))
            sock.listen()
    finally:
        for sock in sockets:
            sock.close()


def test_foreground_server_prints_a_key_it_made_once():
    server = Server(ServerConfig(admin_key="made-at-start-0123456789"))
    line = server_cli._admin_line(server, None)
    assert line.count("made-at-start-0123456789") == 1
    assert "'admin-key: made-at-start-0123456789'" in line
    assert "OPEN" in server_cli._admin_line(Server(ServerConfig(restricted_apis=())), None)


@pytest.mark.parametrize(
    ("server", "numpy", "refused"),
    [
        ("2.51.0", "2.2.6", True),  # the stub of 24.10 with numpy 2: BYTES inputs corrupt
        ("2.51.0", "1.26.4", False),
        ("2.52.0", "2.2.6", False),  # python_backend r24.11 reads numpy 2
        (None, "2.2.6", False),  # unknown server: not refused
    ],
)
def test_numpy_2_is_refused_where_the_python_backend_cannot_read_it(server, numpy, refused):
    problem = launcher.stub_numpy_problem(server, numpy)
    assert (problem is not None) == refused
    if refused:
        assert "numpy<2" in problem and "2.52" in problem


def test_a_server_whose_stub_would_get_numpy_2_refuses_to_start(monkeypatch):
    # Seen with numpy 2.2.6 in the server's venv: the preprocess stub aborted on its first
    # image ("unpack_from requires a buffer of at least 3806520038 bytes"), every request then
    # failed "Stub process is not healthy", and the server did not stop within 30 s.
    monkeypatch.setattr(launcher, "numpy_version", lambda: "2.2.6")
    server = Server(ServerConfig(http_port=0, grpc_port=0, metrics_port=0))
    assert server.installation.version == "2.51.0"
    with pytest.raises(launcher.ServerStartError, match=r"numpy 2\.2\.6 .* tritonserver 2\.51\.0"):
        server.prepare()


def test_native_backends_get_libpython_preloaded_for_the_tokenizer_op(tmp_path):
    (tmp_path / "onnxruntime").mkdir()
    native = launcher.Installation(tmp_path / "tritonserver", tmp_path, tmp_path, bundled=False)
    server = Server(ServerConfig())
    server.installation = native
    shared = launcher.libpython()
    # The bundled server's Python-backend stub links this libpython too: `make test` needs one.
    assert shared is not None, "this Python has no shared libpython (a --enable-shared build)"
    assert server.environment()["LD_PRELOAD"].split()[0] == str(shared)
    (tmp_path / "onnxruntime").rmdir()
    # Without the onnxruntime backend the server's LD_PRELOAD is the caller's, unchanged.
    assert server.environment().get("LD_PRELOAD") == os.environ.get("LD_PRELOAD")


def test_a_server_leaves_the_callers_config_as_it_was(monkeypatch):
    monkeypatch.delenv(launcher.ADMIN_KEY_ENV, raising=False)
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=0)
    one, two = Server(config), Server(config)
    assert config.model_config_name == "auto" and config.admin_key is None
    assert one.config.model_config_name not in (None, "auto")
    assert one.config.admin_key != two.config.admin_key  # each server its own key
    one.config.extra_args.append("--log-info=true")
    assert config.extra_args == []


def test_embeds_shared_cache_reaches_the_stubs_through_the_environment_only(monkeypatch):
    from pipelines.text_cache import URL_ENV

    monkeypatch.setenv(URL_ENV, "redis://:left-over@elsewhere:6379/0")
    url = "redis://:a-password-1234@127.0.0.1:6390/0"
    server = Server(ServerConfig(text_cache_url=url))
    assert server.environment()[URL_ENV] == url
    assert not any("a-password-1234" in arg for arg in server.command())
    # A config without one does not pass the caller's on by accident.
    assert URL_ENV not in Server(ServerConfig()).environment()


def test_tritons_own_redis_cache_replaces_the_local_one():
    server = Server(ServerConfig(response_cache_url="redis://:pw-123@cache.internal:6380/2"))
    flags = [a for a in server.command() if a.startswith("--cache-config")]
    assert flags == [
        "--cache-config=redis,host=cache.internal",
        "--cache-config=redis,port=6380",
        "--cache-config=redis,password=pw-123",
        "--cache-config=redis,db=2",
        "--cache-config=redis,connect_timeout=20",
        "--cache-config=redis,socket_timeout=20",
    ]
    for bad in ("rediss://cache:6380", "redis://:a,b@cache:6380", "http://cache"):
        with pytest.raises(ValueError, match="redis_cache"):
            launcher.redis_cache_args(bad)


def test_onnxruntime_telemetry_is_off_unless_the_operator_turns_it_on(monkeypatch):
    # Its upload held every stub's exit for 7 s where DNS goes unanswered (docs/processes.md).
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
    assert Server().environment()["ORT_DISABLE_TELEMETRY"] == "1"
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "0")
    assert Server().environment()["ORT_DISABLE_TELEMETRY"] == "0"


def test_latency_summaries_are_on_unless_turned_off():
    # make serve, the container entrypoint, compose and Kubernetes all run this command line.
    on = Server(ServerConfig()).command()
    assert "--metrics-config=summary_latencies=true" in on
    assert "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01,0.99:0.001" in on
    off = Server(ServerConfig(summary_latencies=False)).command()
    assert not any(arg.startswith("--metrics-config=summary") for arg in off)


def test_a_bundled_build_copied_without_its_wheel_has_no_known_version(monkeypatch, tmp_path):
    # The GPU check's bundle carries the server's files but not nvidia-pytriton's metadata.
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.delenv("TRITON_SERVER_VERSION", raising=False)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    copied = launcher.Installation(tmp_path / "tritonserver", tmp_path, tmp_path, bundled=True)
    assert copied.version is None
