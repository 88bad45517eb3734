"""The gateway as a tenant meets it, in front of a real server: what it passes, strips, survives.

What is exposed and each limit: docs/operations.md#security. Every refusal here is checked
against the same request sent to Triton directly, which answers it: the gateway is what refuses.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from client.classify import ClassifyClient
from client.embed import build_inputs
from gateway import shaping
from gateway.nginx.config import (
    ENCODING_REFUSED,
    OVERLOADED,
    Clients,
    Gateway,
    OpenAI,
    Shaping,
    Upstreams,
)
from gateway.nginx.process import Nginx
from pipelines import classification, embedding
from tests.helpers import CAT_CLASSES, gzip_of_zeros, inferences, memory_kib

pytestmark = pytest.mark.integration

KEY = "Tenant-Key-0001-a8f3c2"
LIMITS = shaping.parse_limits(
    {
        "anonymous": {"rate": 1000, "capacity": 1000},
        "tenants": {"team": {"keys": [KEY], "rate": 1000, "capacity": 1000}},
        "models": {},
    }
)
STEP = classification.PREPROCESS  # a step of `classify`, loaded, never served through the gateway


@pytest.fixture(scope="module")
def gateway(server, nginx_binary, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("gateway") / "nginx.log"
    with Nginx(Gateway(Upstreams.of(server), shaping=Shaping(LIMITS)), log_path=log_path) as nginx:
        yield nginx


def call(address: str, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    """(status, body) of one request sent with exactly this path (no client-side cleanup)."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


INFER_BODY = json.dumps(
    {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [0]}]}
).encode()
# (method, path, what the gateway answers, what Triton itself answers): Triton serves the step,
# the config or the statistics (200, or 400 for the dummy input), keeps its admin endpoints to
# the key (403 of its own), and finds nothing at the path tricks or the wrong case (404 of its own).
HTTP_CASES = [
    ("GET", f"/v2/models/{STEP}", 404, 200),
    ("GET", f"/v2/models/{STEP}/ready", 404, 200),
    ("POST", f"/v2/models/{STEP}/infer", 404, 400),
    ("POST", f"/v2/models/{embedding.TOKENIZE}/infer", 404, 400),
    ("POST", "/v2/repository/index", 403, 403),
    ("GET", f"/v2/models/{classification.ENSEMBLE}/config", 403, 200),
    ("GET", f"/v2/models/{classification.ENSEMBLE}/versions/1/config", 403, 200),
    ("GET", f"/v2/models/{classification.ENSEMBLE}/stats", 403, 200),
    ("GET", "/v2/models/stats", 403, 200),
    ("GET", "/v2/logging", 403, 403),
    ("GET", "/v2/trace/setting", 403, 403),
    ("GET", "/v2/systemsharedmemory/status", 403, 403),
    # Path tricks: nginx matches the normalised path, so each lands on a refusal.
    ("POST", f"/v2/models/{classification.ENSEMBLE}/../{STEP}/infer", 404, 404),
    ("POST", f"/v2/models/{classification.ENSEMBLE}/%2e%2e/{STEP}/infer", 404, 404),
    ("POST", "//v2//repository/index", 403, 403),
    ("GET", f"/v2/models/{classification.ENSEMBLE.upper()}", 404, 404),
]


@pytest.mark.parametrize(("method", "path", "refused", "triton"), HTTP_CASES, ids=lambda c: str(c))
def test_tenants_reach_only_the_served_models_over_http(
    gateway, server, method, path, refused, triton
):
    body = INFER_BODY if method == "POST" else None
    status, text = call(gateway.http_url, method, path, body)
    wording = "an operator reaches it" if refused == 403 else "this gateway serves"
    assert status == refused and wording in text, text
    # The control: Triton's own answer to the same request, which the gateway did not pass on.
    direct, direct_text = call(server.http_url, method, path.replace("//", "/"), body)
    assert direct == triton and wording not in direct_text, direct_text


def test_served_models_health_and_metadata_pass(gateway, photos):
    for path in (
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        f"/v2/models/{classification.ENSEMBLE}",
    ):
        assert call(gateway.http_url, "GET", path)[0] == 200, path
    with ClassifyClient(gateway.http_url) as client:
        (top,) = client.classify([photos["chelsea"]])
    # A real answer through the gateway: the cat's classes first, scores that sum under 1.
    assert top.labels[0] in CAT_CLASSES and 0 < sum(top.scores) <= 1.0001, top


def grpc_code(method, request, metadata=()) -> grpc.StatusCode:
    try:
        method(request, timeout=30, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_tenants_reach_only_the_served_models_over_grpc(gateway, server):
    with (
        grpc.insecure_channel(gateway.grpc_url) as front,
        grpc.insecure_channel(server.grpc_url) as direct,
    ):
        stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in (front, direct)]
        cases = [
            (lambda s: s.ServerLive, service_pb2.ServerLiveRequest(), grpc.StatusCode.OK),
            (
                lambda s: s.ModelMetadata,
                service_pb2.ModelMetadataRequest(name=classification.ENSEMBLE),
                grpc.StatusCode.OK,
            ),
            (
                lambda s: s.ModelReady,
                service_pb2.ModelReadyRequest(name=STEP),
                grpc.StatusCode.NOT_FOUND,
            ),
            (
                lambda s: s.ModelInfer,
                service_pb2.ModelInferRequest(model_name=STEP),
                grpc.StatusCode.NOT_FOUND,
            ),
            (
                lambda s: s.ModelConfig,
                service_pb2.ModelConfigRequest(name=classification.ENSEMBLE),
                grpc.StatusCode.PERMISSION_DENIED,
            ),
            (
                lambda s: s.ModelStatistics,
                service_pb2.ModelStatisticsRequest(name=classification.ENSEMBLE),
                grpc.StatusCode.PERMISSION_DENIED,
            ),
            (
                lambda s: s.RepositoryIndex,
                service_pb2.RepositoryIndexRequest(),
                grpc.StatusCode.PERMISSION_DENIED,
            ),
            (
                lambda s: s.LogSettings,
                service_pb2.LogSettingsRequest(),
                grpc.StatusCode.PERMISSION_DENIED,
            ),
        ]
        for method, request, expected in cases:
            assert grpc_code(method(stubs[0]), request) == expected, request
            if expected in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                assert grpc_code(method(stubs[1]), request) != expected, request
        # One stream could carry thousands of inferences past the buckets: refused whole.
        stream = stubs[0].ModelStreamInfer(
            iter([service_pb2.ModelInferRequest(model_name=classification.ENSEMBLE)]), timeout=30
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(stream)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_operator_addresses_read_configs_and_statistics(server, tmp_path):
    # What perf_analyzer needs through the gateway (bench/gateway.py gives it 127.0.0.1).
    operators = Clients(operators=("127.0.0.1",))
    with Nginx(
        Gateway(Upstreams.of(server), clients=operators), log_path=tmp_path / "n.log"
    ) as nginx:
        for path in (
            f"/v2/models/{classification.ENSEMBLE}/config",
            f"/v2/models/{classification.ENSEMBLE}/stats",
        ):
            assert call(nginx.http_url, "GET", path)[0] == 200, path
        with grpc.insecure_channel(nginx.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            config = stub.ModelConfig(service_pb2.ModelConfigRequest(name=classification.ENSEMBLE))
            assert config.config.name == classification.ENSEMBLE
            stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name=classification.ENSEMBLE))
            # The admin APIs stay refused.
            assert (
                grpc_code(stub.RepositoryIndex, service_pb2.RepositoryIndexRequest())
                == grpc.StatusCode.PERMISSION_DENIED
            )
        assert call(nginx.http_url, "POST", "/v2/repository/index")[0] == 403


# What reaches the upstream ---------------------------------------------------------------------
class Recorder:
    """An HTTP and a gRPC upstream that record what nginx sends them and answer OK."""

    def __init__(self):
        self.http: list[tuple[dict[str, str], bytes]] = []
        self.grpc: list[tuple[dict[str, str], str]] = []
        self.grpc_sizes: list[int] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                recorder.http.append((dict(self.headers.items()), self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.http_server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

        def infer(request, context):
            recorder.grpc.append((dict(context.invocation_metadata()), request.model_name))
            recorder.grpc_sizes.append(request.ByteSize())
            return service_pb2.ModelInferResponse(model_name=request.model_name)

        self.grpc_server = grpc.server(
            futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self.grpc_server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "inference.GRPCInferenceService",
                    {
                        "ModelInfer": grpc.unary_unary_rpc_method_handler(
                            infer,
                            request_deserializer=service_pb2.ModelInferRequest.FromString,
                            response_serializer=service_pb2.ModelInferResponse.SerializeToString,
                        )
                    },
                )
            ]
        )
        self.grpc_port = self.grpc_server.add_insecure_port("127.0.0.1:0")

    def __enter__(self):
        threading.Thread(target=self.http_server.serve_forever, daemon=True).start()
        self.grpc_server.start()
        return self

    def __exit__(self, *exc):
        self.http_server.shutdown()
        self.http_server.server_close()
        self.grpc_server.stop(0)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_server.server_address[1]}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def shaping_lines(nginx: Nginx, count: int) -> list[dict]:
    """The last ``count`` lines of the access log (nginx writes one after each answer)."""
    deadline = time.monotonic() + 10
    while True:
        lines = nginx.access_log.read_text().splitlines()
        if len(lines) >= count or time.monotonic() > deadline:
            return [json.loads(line) for line in lines[-count:]]
        time.sleep(0.05)


def test_admin_keys_never_reach_triton_and_bodies_arrive_unchunked(tmp_path):
    with (
        Recorder() as upstream,
        Nginx(
            Gateway(Upstreams.of(upstream), shaping=Shaping(LIMITS)), log_path=tmp_path / "n.log"
        ) as nginx,
    ):
        # Chunked, in many small chunks: Triton 2.51's HTTP server spends stack per chunk
        # (CVE-2025-23310/23311, docker/README.md); nginx buffers the body and sends it whole.
        parts = [b'{"inputs":[', *(b" " for _ in range(2000)), b"]}"]
        host, port = nginx.http_url.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request(
            "POST",
            f"/v2/models/{classification.ENSEMBLE}/infer",
            body=iter(parts),
            headers={"admin-key": "guessed", "X-Api-Key": KEY},
            encode_chunked=True,
        )
        assert conn.getresponse().status == 200
        conn.close()
        ((headers, body),) = upstream.http
        names = {name.lower() for name in headers}
        assert "admin-key" not in names and "transfer-encoding" not in names, headers
        assert headers["Content-Length"] == str(len(b"".join(parts))) and body == b"".join(parts)

        request = service_pb2.ModelInferRequest(model_name=classification.ENSEMBLE)
        secrets = [("admin-key", "guessed"), ("triton-grpc-protocol-admin-key", "guessed")]
        with grpc.insecure_channel(nginx.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            # The exact key, then the same key in other letters: a different (unknown) key.
            for key in (KEY, KEY.lower()):
                stub.ModelInfer(request, timeout=30, metadata=[*secrets, ("x-api-key", key)])
        assert [model for _, model in upstream.grpc] == [classification.ENSEMBLE] * 2
        for metadata, _ in upstream.grpc:
            assert not {"admin-key", "triton-grpc-protocol-admin-key"} & set(metadata), metadata

        # A body far beyond nginx's 64 KiB buffer: written to a file, the model read from it,
        # and the whole of it passed on.
        large = service_pb2.ModelInferRequest(model_name=classification.ENSEMBLE)
        large.raw_input_contents.append(bytes(range(256)) * (6 << 12))  # 6 MiB
        with grpc.insecure_channel(nginx.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            stub.ModelInfer(large, timeout=30, metadata=[("x-api-key", KEY)])
        assert (
            upstream.grpc[-1][1] == classification.ENSEMBLE
            and upstream.grpc_sizes[-1] == large.ByteSize()
        )
        # gRPC has the per-model buckets HTTP has: nginx found the model in the body.
        logged = shaping_lines(nginx, 4)
        assert [(line["protocol"], line["model"], line["tenant"]) for line in logged] == [
            ("http", classification.ENSEMBLE, "team"),
            ("grpc", classification.ENSEMBLE, "team"),
            ("grpc", classification.ENSEMBLE, shaping.ANONYMOUS),
            ("grpc", classification.ENSEMBLE, "team"),
        ]


# Hostile clients -------------------------------------------------------------------------------
CONNS = 8  # requests at once per client address, in this test's gateway
TIMEOUT_S = 2  # its header and body timeouts
BODY = 4 << 20  # what each trickling request claims to send
SENT = 3 << 20  # what it sends before it stalls: beyond the 1 MiB in-memory buffer
HOSTILE = "127.0.0.2"  # another loopback address: its own limit_conn key


def rss(nginx: Nginx) -> int:
    """Resident bytes of nginx's master and workers."""
    master = psutil.Process(nginx.process.pid)
    return sum(p.memory_info().rss for p in (master, *master.children()))


class PeakRss:
    """nginx's largest resident size, sampled every 0.05 s in a thread while in ``with``."""

    def __init__(self, nginx: Nginx):
        self.nginx, self.peak = nginx, rss(nginx)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss(self.nginx))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def hostile(address: str, head: bytes) -> socket.socket:
    sock = socket.create_connection(address, timeout=30, source_address=(HOSTILE, 0))
    sock.sendall(head)
    return sock


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the gateway closes ``sock`` (maybe after a 408) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_and_greedy_clients_leave_the_gateway_serving_others(
    server, reference, photos, tmp_path
):
    # Computed first: the in-process pipeline's top classes for the photo, in order.
    (expected,) = reference.classify([photos["chelsea"]])[2].tolist()
    clients = Clients(conns_per_client=CONNS, timeout=f"{TIMEOUT_S}s")
    with Nginx(
        Gateway(Upstreams.of(server), clients=clients), log_path=tmp_path / "nginx.log"
    ) as nginx:
        host, port = nginx.http_url.split(":")
        address = (host, int(port))
        before = rss(nginx)
        path = f"/v2/models/{classification.ENSEMBLE}/infer"
        # Headers that never end, and bodies that stall after 3 MiB: each holds a connection.
        unfinished = f"POST {path} HTTP/1.1\r\n".encode()
        slow_heads = [hostile(address, unfinished) for _ in range(CONNS)]
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n".encode()
        # The peak while nginx holds them all: it reads what they sent as the test goes on.
        with PeakRss(nginx) as peak:
            trickles = [hostile(address, head + b" " * SENT) for _ in range(CONNS)]
            # limit_conn counts a connection once nginx has read its request line and headers:
            # an extra request sent before that is admitted (seen on a busy machine).
            time.sleep(0.5)
            try:
                # One more request from that address is refused at once, with a complete body.
                extra = hostile(address, head.replace(str(BODY).encode(), b"2") + b"{}")
                answer = extra.recv(4096)
                extra.close()
                assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
                assert OVERLOADED.encode() in answer  # JSON that tritonclient reports
                # Everyone else is served meanwhile, with the pipeline's own answer.
                with ClassifyClient(nginx.http_url) as client:
                    (top,) = client.classify([photos["chelsea"]])
                assert top.class_ids == expected, top
                assert call(nginx.http_url, "GET", "/v2/health/ready")[0] == 200
                # The stalled ones are closed once the timeout passes (generous for a busy machine).
                for sock in (*slow_heads, *trickles):
                    assert closed_by_peer(sock, 10 * TIMEOUT_S)
            finally:
                for sock in (*slow_heads, *trickles):
                    sock.close()
        grown = peak.peak - before
        # Memory: what nginx buffers is bounded by its 1 MiB in-memory body buffer per
        # request (the rest goes to a file), not by what the clients send; with a 16 MiB
        # buffer this fails (docs/operations.md#security has both figures).
        assert grown < CONNS * (1 << 20) + (8 << 20), f"nginx grew {grown >> 20} MiB"


# Compressed bodies -----------------------------------------------------------------------------
def raw_post(address: str, path: str, body: bytes, headers: list[tuple[str, str]]):
    """(status, JSON body) of one POST with exactly these headers (a name may repeat)."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.putrequest("POST", path)
        for name, value in [*headers, ("Content-Length", str(len(body)))]:
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        text = response.read()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text
    finally:
        conn.close()


def test_compressed_bodies_are_refused_before_triton(server, tmp_path):
    # Triton 2.51 inflates a gzip body whole before it parses it: this one is 1 GiB.
    bomb = gzip_of_zeros(1 << 30)
    assert len(bomb) < 2 << 20
    key = [("X-Api-Key", KEY)]
    infer = f"/v2/models/{embedding.ENSEMBLE}/infer"
    request, length = httpclient.InferenceServerClient.generate_request_body(
        build_inputs(httpclient, ["a compressed request"])
    )
    binary = [("Inference-Header-Content-Length", str(length))]
    call = json.dumps({"model": embedding.ENSEMBLE, "input": ["a compressed call"]}).encode()
    gateway = Gateway(Upstreams.of(server), shaping=Shaping(LIMITS), openai=OpenAI())
    with Nginx(gateway, log_path=tmp_path / "nginx.log") as nginx:
        pid = server.process.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here on
        before, counted = memory_kib(pid), inferences(server.http_url)
        status, answer = raw_post(nginx.http_url, infer, bomb, [*key, ("Content-Encoding", "gzip")])
        assert status == 415 and answer == {"error": ENCODING_REFUSED}, answer
        for encoding in ("deflate", "br", "GZIP", "gzip, identity"):
            status, _ = raw_post(
                nginx.http_url, infer, request, [*key, ("Content-Encoding", encoding)]
            )
            assert status == 415, encoding
        # OpenAI's API refuses it in its own words.
        status, answer = raw_post(
            nginx.http_url,
            "/v1/embeddings",
            gzip.compress(call),
            [*key, ("Content-Encoding", "gzip")],
        )
        assert status == 415 and answer["error"]["code"] == "unsupported_content_encoding", answer
        # gRPC compresses each message (its first byte says so), never the stream: grpc.js reads
        # no compressed message, so none reaches Triton either. (gRPC sends a message as it is
        # when gzip would not make it smaller: this one shrinks.)
        inputs = build_inputs(grpcclient, ["a compressed message " * 100], truncate=True)
        with grpcclient.InferenceServerClient(nginx.grpc_url) as client:
            with pytest.raises(grpcclient.InferenceServerException) as refused:
                client.infer(embedding.ENSEMBLE, inputs, compression_algorithm="gzip")
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", refused.value
            # Triton's memory and statistics: nothing of any of these reached it.
            after = memory_kib(pid)
            assert after["VmHWM"] - before["VmRSS"] < 16 << 10, (before, after)
            assert inferences(server.http_url) == counted
            # The controls: uncompressed, each is answered (gRPC, HTTP with identity, OpenAI).
            client.infer(embedding.ENSEMBLE, inputs)
        status, _ = raw_post(
            nginx.http_url, infer, request, [*key, *binary, ("Content-Encoding", "identity")]
        )
        assert status == 200
        status, answer = raw_post(nginx.http_url, "/v1/embeddings", call, key)
        assert status == 200 and len(answer["data"]) == 1, answer
        # The same bomb without the header passes the gateway, and Triton reads it as the
        # JSON it is not (its 500 for that): the header is what the gateway refuses.
        status, answer = raw_post(nginx.http_url, infer, bomb, key)
        assert "failed to parse the request JSON" in answer["error"], (status, answer)
        assert inferences(server.http_url) > counted


def test_no_content_encoding_reaches_an_upstream(tmp_path):
    with (
        Recorder() as upstream,
        Nginx(Gateway(Upstreams.of(upstream)), log_path=tmp_path / "n.log") as nginx,
    ):
        infer = f"/v2/models/{classification.ENSEMBLE}/infer"
        # identity is no encoding; a second header of the name is not what nginx checks.
        raw_post(nginx.http_url, infer, b"{}", [("Content-Encoding", "identity")])
        twice = [("Content-Encoding", "identity"), ("Content-Encoding", "gzip")]
        raw_post(nginx.http_url, infer, gzip.compress(b"{}"), twice)
        assert len(upstream.http) == 2
        for headers, _ in upstream.http:
            assert "content-encoding" not in {name.lower() for name in headers}, headers
