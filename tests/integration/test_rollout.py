"""A weighted rollout through the gateway: ``embed`` fp32 (stable) and INT8 (canary).

Two real tritonservers serve ``embed`` under the same name: the session's server (version 1's
fp32 encoder) and a canary whose ``embed`` and ``embed_with_tokens`` run the INT8 encoder
(version 2), loaded with a config that names that version. nginx sends each model's share to
the canary; every answer says which version gave it, since the two versions' vectors differ
(by about 1 % of their length) and each is reproducible to the last bit on its own server.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2

import model_config
from client.embed import EmbedClient, build_inputs
from gateway import shadow, shaping
from gateway.access_log import AccessLogExporter
from gateway.nginx.config import USER_ID_HEADER, Gateway, OpenAI, Shaping, Upstreams
from gateway.nginx.process import Nginx
from gateway.nginx.rollout import CANARY, STABLE, Rollout, Shares
from paths import MODEL_REPOSITORY, REPO_ROOT
from pipelines import embedding
from processes.managed import ManagedProcess, free_port
from server import Server, ServerConfig
from tests.alerting import Prometheus
from tests.helpers import gzip_of_zeros, inferences, memory_kib

pytestmark = pytest.mark.integration

log = logging.getLogger(__name__)

TEXTS = [f"rollout text {i}: a short sentence to embed" for i in range(8)]
INT8_VERSION = 2  # the encoder's INT8 version (model_repository/encoder/config.pbtxt)
HARD_DEADLINE_S = 90.0  # no load here runs longer, whatever happens
GRACE_S = 0.5
# Every request of the rollout is copied to the comparator: each kind of request is compared,
# and the replays are response-cache hits on both servers after the first.
SAMPLE = 100.0


def int8_config(ensemble: str) -> str:
    """``ensemble``'s local config with its encoder step on the INT8 version, as JSON."""
    config = model_config.resolve(MODEL_REPOSITORY / ensemble, "local")
    encoders = (embedding.ENCODER, embedding.TOKENIZE_ENCODE)  # versions 1 fp32, 2 INT8 both
    (step,) = [s for s in config.ensemble_scheduling.step if s.model_name in encoders]
    step.model_version = INT8_VERSION
    return model_config.to_json(config)


@pytest.fixture(scope="module")
def canary(encoder_onnx, tmp_path_factory):
    """A second server whose embed ensembles run the INT8 encoder: the new version."""
    config = ServerConfig(
        http_port=0, grpc_port=0, metrics_port=0, extra_args=["--model-control-mode=explicit"]
    )
    log_path = tmp_path_factory.mktemp("canary") / "tritonserver.log"
    with Server(config, log_path=log_path) as running:
        admin = running.admin_headers()
        with httpclient.InferenceServerClient(running.http_url) as client:
            for ensemble in (embedding.ENSEMBLE, embedding.OPENAI_MODELS[embedding.ENSEMBLE]):
                client.load_model(ensemble, config=int8_config(ensemble), headers=admin)
        yield running


@pytest.fixture(scope="module")
def versions(server, canary) -> dict[str, np.ndarray]:
    """Each version's vectors of TEXTS, asked of its own server."""
    answers = {}
    for version, running in ((STABLE, server), (CANARY, canary)):
        with EmbedClient(running.http_url, "http") as client:
            answers[version] = client.embed(TEXTS)
    # Close (the same model) but told apart at a glance: that is what the tests read.
    cosines = np.sum(answers[STABLE] * answers[CANARY], axis=1)
    assert cosines.min() > 0.98 and np.abs(answers[STABLE] - answers[CANARY]).max() > 1e-3
    return answers


class Recording(shadow.Comparator):
    """The comparator, keeping each copy that arrived (path, body) and each request's path and
    outcome, for the test to read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.arrived: list[tuple[str, dict[str, str], bytes]] = []
        self.seen: list[tuple[str, str]] = []

    def enqueue(self, path, headers, body) -> None:
        self.arrived.append((path, dict(headers), body))
        super().enqueue(path, headers, body)

    def compare(self, path, headers, body) -> str:
        outcome = super().compare(path, headers, body)
        self.seen.append((path, outcome))
        return outcome


@contextlib.contextmanager
def listening(comparator: shadow.Comparator) -> Iterator[str]:
    """The comparator's listener on a free loopback port, in a thread: its address."""
    listener = shadow.listener(comparator, "127.0.0.1", 0)
    thread = threading.Thread(target=listener.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.server_address[1]}"
    finally:
        listener.shutdown()
        listener.server_close()


def serve_metrics(registry) -> tuple[str, Callable[[], None]]:
    """``registry`` on /metrics at a free loopback port: its address, and how to stop it."""
    port = free_port()
    http_server, thread = start_http_server(port, "127.0.0.1", registry=registry)

    def stop() -> None:
        http_server.shutdown()
        thread.join(timeout=5)

    return f"127.0.0.1:{port}", stop


@pytest.fixture(scope="module")
def comparator(server, canary):
    """The rollout's comparator on real servers, listening where nginx mirrors to."""
    replay = shadow.replay_on([server.http_url], [canary.http_url])
    sizes = shadow.batch_sizes_on([server.http_url])
    with Recording(replay, batch_sizes=sizes) as running, listening(running) as copies:
        address, stop = serve_metrics(running.registry)
        try:
            yield running, copies, address
        finally:
            stop()


@pytest.fixture(scope="module")
def gateway(server, canary, comparator, tmp_path_factory):
    """nginx with the rollout of embed at 0 %, every request of it copied to the comparator,
    and the exporter of its access log serving /metrics (its address last)."""
    shares = Shares(((embedding.ENSEMBLE, 0),))
    canaries = ((canary.http_url,), (canary.grpc_url,))
    rollout = Rollout(*canaries, shares, shadow=comparator[1], sample=SAMPLE)
    log_path = tmp_path_factory.mktemp("nginx") / "nginx.log"
    with Nginx(
        Gateway(Upstreams.of(server), openai=OpenAI(), rollout=rollout), log_path=log_path
    ) as nginx:
        exporter = AccessLogExporter(nginx.access_log, interval=0.1).start()
        address, stop = serve_metrics(exporter.registry)
        try:
            yield nginx, exporter, address
        finally:
            stop()
            exporter.stop()


@pytest.fixture(scope="module")
def prometheus(gateway, comparator, tmp_path_factory):
    """A Prometheus scraping the gateway's exporter and the comparator every second."""
    targets = {"gateway": gateway[2], "comparator": comparator[2]}
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ],
    }
    with Prometheus(tmp_path_factory.mktemp("prometheus"), config) as process:
        yield process


def which(vector: np.ndarray, index: int, versions: dict[str, np.ndarray]) -> str:
    """The version whose vector of TEXTS[index] this is; fails on any other."""
    for version, vectors in versions.items():
        if np.allclose(vector, vectors[index], rtol=0, atol=1e-6):
            return version
    raise AssertionError(f"text {index}: a vector from neither version")


def http_sender(nginx, versions, user: str | None = None):
    """send(i) → the version that embedded TEXTS[i % len] over HTTP through the gateway."""
    client = httpclient.InferenceServerClient(nginx.http_url)
    headers = {USER_ID_HEADER: user} if user else None

    def send(i: int) -> str:
        index = i % len(TEXTS)
        inputs = build_inputs(httpclient, [TEXTS[index]])
        result = client.infer(embedding.ENSEMBLE, inputs, headers=headers)
        return which(result.as_numpy(embedding.EMBEDDING)[0], index, versions)

    return send, client


def grpc_sender(nginx, versions):
    """The same over gRPC."""
    client = grpcclient.InferenceServerClient(nginx.grpc_url)

    def send(i: int) -> str:
        index = i % len(TEXTS)
        inputs = build_inputs(grpcclient, [TEXTS[index]])
        result = client.infer(embedding.ENSEMBLE, inputs)
        return which(result.as_numpy(embedding.EMBEDDING)[0], index, versions)

    return send, client


def openai_sender(nginx, versions):
    """The same through OpenAI's API: one call of two Triton requests (more texts than one
    takes), which must both meet the same version."""
    sdk = openai.OpenAI(base_url=f"http://{nginx.http_url}/v1", api_key="none", max_retries=0)
    texts = TEXTS * (embedding.MAX_TEXTS // len(TEXTS) + 1)

    def send(i: int) -> str:
        got = sdk.embeddings.create(model=embedding.ENSEMBLE, input=texts)
        seen = {
            which(np.array(d.embedding, dtype=np.float32), d.index % len(TEXTS), versions)
            for d in got.data
        }
        assert len(seen) == 1, f"one call answered by both versions: {seen}"
        return seen.pop()

    return send, sdk


def move(nginx: Nginx, *shares: str, sticky: bool = False) -> str:
    """The operator's command, as a subprocess: ``python -m gateway.nginx rollout``."""
    command = [sys.executable, "-m", "gateway.nginx", "rollout"]
    command += ["--shares-file", str(nginx.shares_file), *shares]
    command.append("--sticky" if sticky else "--per-request")
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def counted(exporter: AccessLogExporter, version: str, protocol: str) -> float:
    """The exporter's admitted embed requests of one version over one protocol."""
    labels = {"gateway": "nginx", "tenant": "anonymous", "model": embedding.ENSEMBLE}
    labels |= {"protocol": protocol, "outcome": "admitted", "version": version}
    return exporter.registry.get_sample_value("gateway_requests_total", labels) or 0.0


def settled(exporter: AccessLogExporter, total: float, protocols=("http", "grpc")) -> None:
    """Wait until the exporter has counted ``total`` requests of both versions."""
    deadline = time.monotonic() + 10
    while True:
        seen = sum(counted(exporter, v, p) for v in (STABLE, CANARY) for p in protocols)
        if seen >= total:
            return
        assert time.monotonic() < deadline, f"the exporter counted {seen} of {total}"
        time.sleep(0.1)


def test_each_request_goes_to_the_canary_with_its_share(gateway, versions):
    nginx, exporter, _ = gateway
    out = move(nginx, "embed=20")
    assert "embed: 0% -> 20% to the canary" in out
    before = {(v, p): counted(exporter, v, p) for v in (STABLE, CANARY) for p in ("http", "grpc")}
    got: Counter = Counter()
    for protocol, make in (("http", http_sender), ("grpc", grpc_sender)):
        send, client = make(nginx, versions)
        try:
            for i in range(200):
                got[protocol, send(i)] += 1
        finally:
            client.close()
    share = (got["http", CANARY] + got["grpc", CANARY]) / 400
    log.info("20 %% asked, %.1f %% on the canary: %s", 100 * share, dict(got))
    # 400 requests at 20 %: one standard deviation is 2 points; 8 is 4 of them.
    assert 0.12 <= share <= 0.28, got
    assert got["http", CANARY] and got["grpc", CANARY], got
    # The exporter's per-version counts are what the answers showed.
    settled(exporter, sum(before.values()) + 400)
    for (protocol, version), n in got.items():
        assert counted(exporter, version, protocol) - before[version, protocol] == n


def test_sticky_shares_keep_each_user_on_one_version(gateway, versions):
    nginx, _, _ = gateway
    move(nginx, "embed=50", sticky=True)
    per_user = {}
    for u in range(40):
        send, client = http_sender(nginx, versions, user=f"user-{u}")
        try:
            per_user[u] = {send(i) for i in range(3)}
        finally:
            client.close()
    assert all(len(seen) == 1 for seen in per_user.values()), per_user
    on_canary = sum(seen == {CANARY} for seen in per_user.values())
    # 40 users at 50 %: both versions hold some (all on one side: 2 in 10^12).
    assert 5 <= on_canary <= 35, on_canary


def test_a_rollout_and_its_rollback_under_load_drop_nothing(gateway, versions):
    nginx, _, _ = gateway
    move(nginx, "embed=0")
    stop = threading.Event()
    deadline = time.monotonic() + HARD_DEADLINE_S
    answers: dict[str, list[tuple[float, str]]] = {"http": [], "grpc": [], "openai": []}
    failures: list[str] = []

    def load(protocol: str, make) -> None:
        send, client = make(nginx, versions)
        try:
            i = 0
            while not stop.is_set() and time.monotonic() < deadline:
                sent = time.monotonic()
                try:
                    answers[protocol].append((sent, send(i)))
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    failures.append(f"{protocol}: {type(exc).__name__}: {exc}")
                i += 1
        finally:
            client.close()

    threads = [
        threading.Thread(target=load, args=(p, m), daemon=True)
        for p, m in (("http", http_sender), ("grpc", grpc_sender), ("openai", openai_sender))
    ]
    for thread in threads:
        thread.start()
    moved = {}
    try:
        for share in (5, 50, 100, 0):
            time.sleep(2.0)
            move(nginx, f"embed={share}")
            moved[share] = time.monotonic()
        time.sleep(2.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    log.info("under load: %s answered, %d failed", {p: len(a) for p, a in answers.items()},
             len(failures))  # fmt: skip
    assert not failures, failures[:5]
    every = [a for protocol in answers.values() for a in protocol]
    assert len(every) > 100, {p: len(a) for p, a in answers.items()}
    # At 100 %, every request sent after the move (and before the next) met the canary;
    # after the rollback, the stable version alone.
    # (A request sent within half a second of a move may still meet an old worker: it had
    # read that request from its connection before closing it.)
    at_100 = {v for t, v in every if moved[100] + GRACE_S < t < moved[0] - GRACE_S}
    after = {v for t, v in every if t > moved[0] + GRACE_S}
    assert at_100 == {CANARY}, at_100
    assert after == {STABLE}, after
    for protocol, got in answers.items():
        assert {v for _, v in got} == {STABLE, CANARY}, protocol


def test_prometheus_holds_both_versions_side_by_side(gateway, prometheus, versions):
    nginx, _, _ = gateway
    move(nginx, "embed=50")
    senders = [make(nginx, versions) for make in (http_sender, grpc_sender)]
    buckets = 'gateway_request_duration_seconds_bucket{model="embed"}'
    queries = (
        'sum by (version) (gateway_request_duration_seconds_count{model="embed"})',
        f"histogram_quantile(0.99, sum by (version, le) (rate({buckets}[1m])))",
        'sum by (version) (rate(gateway_requests_total{model="embed"}[1m]))',
    )
    deadline = time.monotonic() + 30
    try:
        # Traffic over several scrapes, so that rates have two samples to work on.
        while True:
            for send, _ in senders:
                for i in range(10):
                    send(i)
            seen = [{r["metric"].get("version") for r in prometheus.query(q)} for q in queries]
            if all(versions_seen == {STABLE, CANARY} for versions_seen in seen):
                break
            assert time.monotonic() < deadline, dict(zip(queries, seen, strict=True))
            time.sleep(0.5)
    finally:
        for _, client in senders:
            client.close()


def test_the_comparator_finds_the_versions_close_but_not_equal(gateway, comparator, prometheus):
    recording, _, _ = comparator
    # Earlier tests sent every kind of request through the rollout: each was compared.
    compared = {path for path, outcome in recording.seen if outcome == shadow.COMPARED}
    assert {"/v2/models/embed/infer", shadow.GRPC_INFER, shadow.OPENAI_EMBEDDINGS} <= compared
    cosines = "gateway_rollout_cosine_bucket"
    deadline = time.monotonic() + 30
    while not (total := prometheus.query(f'{cosines}{{model="embed",le="+Inf"}}')):
        assert time.monotonic() < deadline, "Prometheus has no cosines of the comparator"
        time.sleep(0.5)
    total = float(total[0]["value"][1])
    below = {
        le: float(prometheus.query(f'{cosines}{{model="embed",le="{le}"}}')[0]["value"][1])
        for le in ("0.98", "0.9999")
    }
    log.info("cosines: %d, under 0.98: %d, under 0.9999: %d; by path: %s", total,
             below["0.98"], below["0.9999"], Counter(recording.seen))  # fmt: skip
    # INT8 against fp32: every pair close (none under 0.98) and not one version twice (most
    # under 0.9999; the same server twice gives 1.0 exactly).
    assert total > 0 and below["0.98"] == 0, (total, below)
    assert below["0.9999"] >= 0.9 * total, (total, below)


def test_a_copy_carries_no_content_encoding(gateway, comparator):
    nginx, _, _ = gateway
    recording, _, _ = comparator
    # gRPC's own compression is grpc-encoding and a flag in each message; this header is
    # metadata to it, which a client may send, and which the copy must not take as its body's.
    text = "a gRPC request whose metadata says gzip"
    with grpcclient.InferenceServerClient(nginx.grpc_url) as client:
        client.infer(
            embedding.ENSEMBLE,
            build_inputs(grpcclient, [text]),
            headers={"content-encoding": "gzip"},
        )
    deadline = time.monotonic() + 30
    while not (copies := [c for c in recording.arrived if text.encode() in c[2]]):
        assert time.monotonic() < deadline, "no copy of the request arrived"
        time.sleep(0.1)
    ((path, headers, body),) = copies
    assert "content-encoding" not in {name.lower() for name in headers}, headers
    # What the comparator compares: the request's own text.
    model, inputs = shadow.decode_request(path, headers, body)
    assert model == embedding.ENSEMBLE and inputs[embedding.TEXT][0, 0] == text.encode()


# What reaches the comparator, and what it may cost ---------------------------------------------
CALM_KEY, SPENT_KEY = "calm-key-0001", "spent-key-0001"
ONE_CALL = {"rate": 1 / 60, "capacity": 1}  # nginx's slowest rate: one call, then 429s


def post(address: str, path: str, body: bytes, headers: dict[str, str]) -> int:
    """The status of one POST of ``body`` to ``address``."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_only_admitted_openai_calls_reach_the_comparator(server, canary, tmp_path):
    limits = shaping.parse_limits(
        {
            "anonymous": ONE_CALL,
            "tenants": {
                "calm": {"keys": [CALM_KEY], "rate": 1000, "capacity": 1000},
                "spent": {"keys": [SPENT_KEY], **ONE_CALL},
            },
            "models": {},
        }
    )
    recording = Recording(shadow.replay_on([server.http_url], [canary.http_url]))
    with recording, listening(recording) as copies:
        shares = Shares(((embedding.ENSEMBLE, 0),))
        rollout = Rollout(
            (canary.http_url,), (canary.grpc_url,), shares, shadow=copies, sample=SAMPLE
        )
        gateway = Gateway(
            Upstreams.of(server), shaping=Shaping(limits), openai=OpenAI(), rollout=rollout
        )
        with Nginx(gateway, log_path=tmp_path / "nginx.log") as nginx:

            def call(key: str | None, texts, model=embedding.ENSEMBLE, **headers) -> int:
                body = json.dumps({"model": model, "input": texts}).encode()
                if headers.get("Content-Encoding") == "gzip":
                    body = gzip.compress(body)
                if key:
                    headers["Authorization"] = f"Bearer {key}"
                return post(nginx.http_url, "/v1/embeddings", body, headers)

            # Each call's text names it (a marker), so that its copy can be told apart.
            statuses = {
                "spent, admitted": call(SPENT_KEY, ["spent, admitted"]),
                "spent, over its rate": call(SPENT_KEY, ["spent, over its rate"]),
                "anonymous, admitted": call(None, ["anonymous, admitted"]),
                "anonymous, over its rate": call(None, ["anonymous, over its rate"]),
                "an unknown model": call(CALM_KEY, ["an unknown model"], model="gpt-4"),
                "an empty text": call(CALM_KEY, ["an empty text", ""]),
                "too many texts": call(CALM_KEY, ["too many texts"] * 2049),
                "compressed": call(CALM_KEY, ["compressed"], **{"Content-Encoding": "gzip"}),
                "the control": call(CALM_KEY, ["the control"]),
            }
            broken = b'{"model": "embed", "input": ["broken JSON'
            calm = {"Authorization": f"Bearer {CALM_KEY}"}
            assert post(nginx.http_url, "/v1/embeddings", broken, calm) == 400
            assert statuses == {
                "spent, admitted": 200,
                "spent, over its rate": 429,
                "anonymous, admitted": 200,
                "anonymous, over its rate": 429,
                "an unknown model": 404,
                "an empty text": 400,
                "too many texts": 413,
                "compressed": 415,
                "the control": 200,
            }, statuses
            # The copy of the last call, once it is there, comes after any of the others'.
            deadline = time.monotonic() + 30
            while not any(b"the control" in body for _, _, body in recording.arrived):
                assert time.monotonic() < deadline, "the control's copy never arrived"
                time.sleep(0.1)
    markers = [m for m in statuses if any(m.encode() in b for _, _, b in recording.arrived)]
    assert markers == ["spent, admitted", "anonymous, admitted", "the control"], markers
    assert len(recording.arrived) == 3, recording.arrived
    # And each was compared (the comparator has stopped: its queue is done).
    assert [outcome for _, outcome in recording.seen] == [shadow.COMPARED] * 3, recording.seen


COPIES_HOST, METRICS_HOST = "127.0.0.1", "127.0.0.2"  # two loopback addresses
HTTP_INFER_PATH = f"/v2/models/{embedding.ENSEMBLE}/infer"
MAX_RSS_MB = 300


class ComparatorProcess(ManagedProcess):
    """``python -m gateway.shadow`` as an operator runs it: copies taken on one address, its
    metrics served on another."""

    name = "comparator"

    def __init__(self, stable: str, canary: str, log_path):
        super().__init__(log_path)
        self.stable, self.canary = stable, canary
        self.port = self.metrics_port = 0

    def prepare(self) -> None:
        self.port, self.metrics_port = free_port(COPIES_HOST), free_port(METRICS_HOST)

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "gateway.shadow", "--stable", self.stable),
            *("--canary", self.canary, "--host", COPIES_HOST, "--port", str(self.port)),
            *("--metrics-host", METRICS_HOST, "--metrics-port", str(self.metrics_port)),
        ]

    @property
    def ready_url(self) -> str:
        return f"http://{METRICS_HOST}:{self.metrics_port}/metrics"

    def outcomes(self) -> Counter:
        """Its gateway_rollout_shadow_total, by outcome (over every model)."""
        with urllib.request.urlopen(self.ready_url, timeout=10) as response:
            text = response.read().decode()
        counts: Counter = Counter()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"{shadow.SHADOW_METRIC}_total":
                    counts[sample.labels["outcome"]] += sample.value
        return counts


def grpc_frame(texts: list[str]) -> bytes:
    """A gRPC ModelInferRequest frame of embed's TEXT rows, as tritonclient writes it."""
    request = service_pb2.ModelInferRequest(model_name=embedding.ENSEMBLE)
    for tensor in build_inputs(grpcclient, texts):
        request.inputs.append(tensor._get_tensor())
        request.raw_input_contents.append(tensor._get_content())
    message = request.SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


def kserve(texts: list[str]) -> tuple[dict[str, str], bytes]:
    """Headers and body of tritonclient's HTTP request of embed's TEXT rows."""
    inputs = build_inputs(httpclient, texts)
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs)
    return {"Inference-Header-Content-Length": str(length)}, body


def oversized() -> list[tuple[str, dict[str, str], bytes]]:
    """Copies past each of the comparator's bounds (path, headers, body), as a gateway's client
    could have them sent, or anyone who reaches its port."""
    many = ["t"] * 4096  # 64 times embed's max_batch_size
    deflater = zlib.compressobj(9)
    block = bytes(1 << 20)
    deflated = b"".join([*(deflater.compress(block) for _ in range(256)), deflater.flush()])
    # 6 MiB of JSON, two million lists once parsed.
    nested = b",".join([b"[]"] * (2 << 20))
    tensor = b'{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [' + nested + b"]}"
    call = {"model": embedding.ENSEMBLE, "input": ["t"] * (embedding.MAX_OPENAI_INPUTS + 1)}
    return [
        (HTTP_INFER_PATH, {"Content-Encoding": "gzip"}, gzip_of_zeros(256 << 20)),
        (HTTP_INFER_PATH, {"Content-Encoding": "deflate"}, deflated),
        (HTTP_INFER_PATH, *kserve(many)),
        (shadow.GRPC_INFER, {}, grpc_frame(many)),
        (HTTP_INFER_PATH, {}, b" " * (shadow.Bounds.body + 1)),
        (HTTP_INFER_PATH, {}, b'{"inputs": [' + tensor + b"]}"),
        (shadow.OPENAI_EMBEDDINGS, {}, json.dumps(call).encode()),
    ]


def test_oversized_copies_leave_the_comparator_small_and_the_servers_untouched(
    server, canary, tmp_path
):
    kinds = oversized()
    total = 20
    samples = [kinds[i % len(kinds)] for i in range(total)]
    process = ComparatorProcess(server.http_url, canary.http_url, tmp_path / "comparator.log")
    process.start(cwd=REPO_ROOT)
    try:
        counted = {url: inferences(url) for url in (server.http_url, canary.http_url)}
        statuses: Counter = Counter()
        for path, headers, body in samples:
            headers = {**headers, shadow.MODELS_HEADER: embedding.ENSEMBLE}
            statuses[post(f"{COPIES_HOST}:{process.port}", path, body, headers)] += 1
        deadline = time.monotonic() + 120
        while sum((outcomes := process.outcomes()).values()) < total:
            assert time.monotonic() < deadline, f"{total} copies, {outcomes} counted"
            time.sleep(0.2)
        peak = memory_kib(process.process.pid)["VmHWM"]
        log.info("%d oversized copies: answers %s, outcomes %s, peak RSS %d MiB", total,
                 dict(statuses), dict(outcomes), peak >> 10)  # fmt: skip
        # A body over the bound is read past and answered 413, the others 204 at once.
        too_large = sum(len(body) > shadow.Bounds.body for _, _, body in samples)
        assert statuses == Counter({204: total - too_large, 413: too_large}), statuses
        # Each skipped (or dropped, had the queue been full), none sent to either version...
        assert outcomes[shadow.SKIPPED] + outcomes[shadow.DROPPED] == total, outcomes
        assert {url: inferences(url) for url in counted} == counted
        # ...and what they cost the comparator at its peak, while a bomb alone inflates to
        # 256 MiB. (It starts at about 60 MiB: numpy, tritonclient, prometheus_client.)
        assert peak * 1024 < MAX_RSS_MB * 10**6, f"peak RSS {peak >> 10} MiB"
        # The copies' address and the metrics' are apart: neither port is on the other.
        for address in ((METRICS_HOST, process.port), (COPIES_HOST, process.metrics_port)):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(address, timeout=5).close()
        # The control: an ordinary copy after them is compared.
        headers, body = kserve(TEXTS[:3])
        headers[shadow.MODELS_HEADER] = embedding.ENSEMBLE
        assert post(f"{COPIES_HOST}:{process.port}", HTTP_INFER_PATH, body, headers) == 204
        deadline = time.monotonic() + 60
        while process.outcomes()[shadow.COMPARED] < 1:
            assert time.monotonic() < deadline, f"the control not compared: {process.outcomes()}"
            time.sleep(0.2)
    finally:
        process.stop()
