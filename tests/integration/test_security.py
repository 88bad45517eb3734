"""Admin endpoints behind a key, where the server listens, and oversize requests, on a real server.

The session server runs with the launcher's defaults: model control, the repository index,
shared-memory registration and the log and trace settings restricted to the admin key over HTTP
and gRPC; inference, health, metadata, configs and statistics open.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client.classify import ClassifyClient
from client.embed import EmbedClient
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding
from server import Server, ServerConfig
from server.launcher import ADMIN_APIS, free_port
from tests.helpers import REPO

pytestmark = pytest.mark.integration

HTTP_REFUSED = "This API is restricted, expecting header 'admin-key'"
GRPC_REFUSED = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
WRONG_KEY = "not-the-key-but-long-enough"
SMALL_MODEL = "postprocess"  # loads in a second, no weights


def http_call(server, method: str, path: str, body: dict | None = None, headers=None):
    """(status, body) of one raw HTTP request, so the exact status code is what we assert."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=data, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# Every restricted HTTP API, one request each: (api, method, path, body).
HTTP_ADMIN_CALLS = [
    ("model-repository", "POST", "/v2/repository/index", {}),
    ("model-repository", "POST", f"/v2/repository/models/{SMALL_MODEL}/unload", {}),
    ("model-repository", "POST", f"/v2/repository/models/{SMALL_MODEL}/load", {}),
    ("logging", "GET", "/v2/logging", None),
    ("logging", "POST", "/v2/logging", {"log_verbose_level": 1}),
    ("shared-memory", "GET", "/v2/systemsharedmemory/status", None),
    (
        "shared-memory",
        "POST",
        "/v2/systemsharedmemory/region/probe/register",
        {"key": "/probe", "offset": 0, "byte_size": 64},
    ),
    ("trace", "GET", "/v2/trace/setting", None),
]


def test_every_admin_api_is_restricted_by_default(server):
    assert {api for api, *_ in HTTP_ADMIN_CALLS} == set(ADMIN_APIS)
    assert set(server.config.restricted_apis) == set(ADMIN_APIS) and server.config.admin_key


@pytest.mark.parametrize("headers", [None, {"admin-key": WRONG_KEY}], ids=["no-key", "wrong-key"])
@pytest.mark.parametrize(
    ("api", "method", "path", "body"), HTTP_ADMIN_CALLS, ids=[c[2] for c in HTTP_ADMIN_CALLS]
)
def test_http_admin_calls_without_the_key_are_refused(server, api, method, path, body, headers):
    status, text = http_call(server, method, path, body, headers)
    assert status == 403 and json.loads(text) == {"error": HTTP_REFUSED}
    # Nothing happened: the model is still served and logging still at its start setting.
    assert http_call(server, "GET", f"/v2/models/{SMALL_MODEL}/ready")[0] == 200
    _, settings = http_call(server, "GET", "/v2/logging", headers=server.admin_headers())
    assert json.loads(settings)["log_verbose_level"] == 0


def test_http_admin_calls_with_the_key_work(server):
    key = server.admin_headers("http")
    status, text = http_call(server, "POST", "/v2/repository/index", {}, key)
    assert status == 200
    assert {classification.ENSEMBLE, embedding.ENSEMBLE} <= {m["name"] for m in json.loads(text)}
    status, text = http_call(server, "GET", "/v2/logging", headers=key)
    assert status == 200 and json.loads(text)["log_info"] is True
    assert http_call(server, "GET", "/v2/systemsharedmemory/status", headers=key) == (200, "[]")
    status, text = http_call(server, "GET", "/v2/trace/setting", headers=key)
    assert status == 200 and "trace_level" in json.loads(text)
    # The key passes the restriction; model control itself is off on this server (mode none).
    status, text = http_call(server, "POST", f"/v2/repository/models/{SMALL_MODEL}/unload", {}, key)
    assert status != 403 and "restricted" not in text
    assert http_call(server, "GET", f"/v2/models/{SMALL_MODEL}/ready")[0] == 200


def grpc_admin_calls(client: grpcclient.InferenceServerClient):
    return {
        "repository index": lambda **h: client.get_model_repository_index(**h),
        "unload": lambda **h: client.unload_model(SMALL_MODEL, **h),
        "load": lambda **h: client.load_model(SMALL_MODEL, **h),
        "log settings": lambda **h: client.get_log_settings(**h),
        "update log settings": lambda **h: client.update_log_settings(
            {"log_verbose_level": 1}, **h
        ),
        "shm status": lambda **h: client.get_system_shared_memory_status(**h),
        "shm register": lambda **h: client.register_system_shared_memory("p", "/p", 64, **h),
        "trace settings": lambda **h: client.get_trace_settings(**h),
    }


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {"triton-grpc-protocol-admin-key": WRONG_KEY},
        {"admin-key": "the right key, wrong name"},
    ],
    ids=["no-key", "wrong-key", "http-header-name"],
)
def test_grpc_admin_calls_without_the_key_are_refused(server, headers):
    if headers and headers.get("admin-key"):
        headers = {"admin-key": server.config.admin_key}  # HTTP's name does not open gRPC
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for name, call in grpc_admin_calls(client).items():
            with pytest.raises(InferenceServerException) as refused:
                call(headers=headers)
            # Triton 2.51 answers a restricted gRPC call with UNAVAILABLE (not PERMISSION_DENIED).
            assert refused.value.status() == "StatusCode.UNAVAILABLE", name
            assert refused.value.message() == GRPC_REFUSED, name
        assert client.is_model_ready(SMALL_MODEL)
        log = client.get_log_settings(headers=server.admin_headers("grpc"), as_json=True)
        assert log["settings"]["log_verbose_level"]["uint32_param"] == 0


def test_grpc_admin_calls_with_the_key_work(server):
    key = server.admin_headers("grpc")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        index = client.get_model_repository_index(headers=key, as_json=True)
        assert {classification.ENSEMBLE, embedding.ENSEMBLE} <= {m["name"] for m in index["models"]}
        log = client.get_log_settings(headers=key, as_json=True)
        assert log["settings"]["log_info"]["bool_param"] is True
        assert client.get_system_shared_memory_status(headers=key, as_json=True) == {}
        assert "trace_level" in client.get_trace_settings(headers=key, as_json=True)["settings"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inference_health_metadata_and_statistics_need_no_key(server, photos, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with mod.InferenceServerClient(url) as client:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(classification.ENSEMBLE)
        assert client.get_server_metadata()
        assert client.get_model_metadata(classification.ENSEMBLE)
        assert client.get_model_config(classification.PREPROCESS)
        assert client.get_inference_statistics(classification.PREPROCESS)
    with ClassifyClient(url, protocol) as classify:
        assert classify.classify([photos["chelsea"]])[0].class_ids


# Load and unload for real: a second server whose models are under explicit control, bound to
# every interface (which the listening-socket test below also uses).
@pytest.fixture(scope="module")
def explicit_server(classifier_onnx, tmp_path_factory):
    config = ServerConfig(
        host="0.0.0.0",
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        cache_bytes=0,
        extra_args=["--model-control-mode=explicit", f"--load-model={SMALL_MODEL}"],
    )
    log_path = tmp_path_factory.mktemp("triton-explicit") / "tritonserver.log"
    with Server(config, log_path=log_path) as running:
        yield running


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_only_the_key_unloads_and_loads_models(explicit_server, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    url = explicit_server.http_url if protocol == "http" else explicit_server.grpc_url
    key = explicit_server.admin_headers(protocol)
    with mod.InferenceServerClient(url) as client:
        assert client.is_model_ready(SMALL_MODEL)
        with pytest.raises(InferenceServerException, match="restricted"):
            client.unload_model(SMALL_MODEL)
        assert client.is_model_ready(SMALL_MODEL)
        client.unload_model(SMALL_MODEL, headers=key)
        assert not client.is_model_ready(SMALL_MODEL)
        with pytest.raises(InferenceServerException, match="restricted"):
            client.load_model(SMALL_MODEL)
        assert not client.is_model_ready(SMALL_MODEL)
        client.load_model(SMALL_MODEL, headers=key)
        assert client.is_model_ready(SMALL_MODEL)


# Where the servers listen ----------------------------------------------------------------------
def listening(port: int) -> set[str]:
    """The addresses with a socket listening on ``port`` (psutil reads the kernel's tables).

    gRPC listens on an IPv6 socket: IPv4-mapped addresses come back as IPv4, ``::`` (every
    interface, both families) as ``::``.
    """
    found = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or conn.laddr.port != port:
            continue
        ip = ipaddress.ip_address(conn.laddr.ip.split("%")[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        found.add(str(mapped or ip))
    return found


def outward_address() -> str | None:
    """This machine's non-loopback IPv4 address (a UDP connect sends nothing), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never reached
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def reachable(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=3).close()
        return True
    except OSError:
        return False


def ports(server) -> list[int]:
    c = server.config
    return [c.http_port, c.grpc_port, c.metrics_port]


def test_the_default_server_listens_on_loopback_only(server):
    assert server.config.host == ServerConfig().host == "127.0.0.1"
    for port in ports(server):
        assert listening(port) == {"127.0.0.1"}
        assert reachable("127.0.0.1", port)
        outward = outward_address()
        if outward:
            assert not reachable(outward, port), f"{outward}:{port} answers"


def test_a_server_told_to_listens_everywhere(explicit_server):
    for port in ports(explicit_server):
        assert listening(port) in ({"0.0.0.0"}, {"::"})  # IPv4 or dual-stack, all interfaces
        outward = outward_address()
        if outward:
            assert reachable(outward, port)


def test_the_gateway_told_to_listen_everywhere_keeps_triton_on_loopback(tmp_path):
    """``python -m gateway serve --host 0.0.0.0``: the gateway is for other machines, Triton not."""
    repo = tmp_path / "models"
    shutil.copytree(MODEL_REPOSITORY / SMALL_MODEL, repo / SMALL_MODEL)
    gateway = {"--gateway-port": free_port(), "--gateway-grpc-port": free_port()}
    triton = {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": free_port()}
    argv = [sys.executable, "-m", "gateway", "serve", "--host", "0.0.0.0"]
    argv += [f"{flag}={port}" for flag, port in {**gateway, **triton}.items()]
    argv += ["--model-repository", str(repo), "--", "--exit-timeout-secs=3"]
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any("Ctrl-C stops it" in line for line in lines):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "no banner:\n" + "".join(lines)
            lines.append(line)
        for port in gateway.values():
            assert listening(port) == {"0.0.0.0"}
        for port in triton.values():
            assert listening(port) == {"127.0.0.1"}
            assert reachable("127.0.0.1", port)  # the control: it is up, on loopback
        outward = outward_address()
        if outward:
            for port in gateway.values():
                assert reachable(outward, port), f"gateway {outward}:{port} does not answer"
            for port in triton.values():
                assert not reachable(outward, port), f"Triton {outward}:{port} answers"
            status, _ = http_call_at(f"{outward}:{gateway['--gateway-port']}", "/v2/health/ready")
            assert status == 200
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def http_call_at(address: str, path: str) -> tuple[int, str]:
    """(status, body) of a GET to ``http://address/path``."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# Oversize requests -----------------------------------------------------------------------------
def test_this_server_has_no_body_limit_flag_and_the_launcher_passes_none(server):
    # tritonserver 2.51 (the wheel and NGC 24.10) has no --http-max-input-size; newer ones do.
    if server.installation.supports("--http-max-input-size"):
        assert f"--http-max-input-size={server.config.max_input_bytes}" in server.command()
    else:
        assert not any("max-input-size" in arg for arg in server.command())


def refusal(server, protocol: str, model: str, name: str, item: bytes) -> InferenceServerException:
    """The error of one request with a single BYTES item (it must fail)."""
    mod = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with mod.InferenceServerClient(url) as client:
        tensor = mod.InferInput(name, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[item]], dtype=np.object_))
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, [tensor])
        assert client.is_server_ready()
    assert refused.value.status() == (
        "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    )
    return refused.value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_80_mib_image_is_refused_cleanly_and_the_server_serves_on(server, photos, protocol):
    size = 80 << 20
    error = refusal(
        server, protocol, classification.ENSEMBLE, classification.IMAGE, os.urandom(size)
    )
    assert f"IMAGE[0]: not an image: cannot identify format of {size} bytes" in error.message()
    url = server.http_url if protocol == "http" else server.grpc_url
    with ClassifyClient(url, protocol) as classify:
        assert classify.classify([photos["chelsea"]])[0].class_ids


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_text_over_256_kib_is_refused_before_tokenizing(server, protocol):
    size = 256 * 1024 + 1
    error = refusal(server, protocol, embedding.ENSEMBLE, embedding.TEXT, b"a" * size)
    assert f"TEXT[0]: text too large: {size} bytes, over the 262144-byte limit" in error.message()
    # Just under the limit is embedded where its request lets it be cut at 256 word pieces.
    url = server.http_url if protocol == "http" else server.grpc_url
    with EmbedClient(url, protocol) as client:
        vectors = client.embed([f"{protocol} " + "word " * (256 * 1024 // 5 - 1)], truncate=True)
    assert vectors.shape == (1, embedding.HIDDEN_SIZE)
