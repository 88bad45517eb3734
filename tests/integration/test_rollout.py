"""A weighted rollout through the gateway: ``embed`` fp32 (stable) and INT8 (canary).

Two real tritonservers serve ``embed`` under the same name: the session's server (version 1's
fp32 encoder) and a canary whose ``embed`` and ``embed_with_tokens`` run the INT8 encoder
(version 2), loaded with a config that names that version. nginx sends each model's share to
the canary; every answer says which version gave it, since the two versions' vectors differ
(by about 1 % of their length) and each is reproducible to the last bit on its own server.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client import start_http_server

import model_config
from client.embed import EmbedClient, build_inputs
from gateway import shadow
from gateway.metrics import ShapingLogExporter
from gateway.nginx.config import CANARY, STABLE, USER_ID_HEADER, OpenAI, Rollout, Shares
from gateway.nginx.process import Nginx
from paths import MODEL_REPOSITORY
from pipelines import embedding
from processes.managed import free_port
from server import Server, ServerConfig
from tests.alerting import Prometheus

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
    """The comparator, keeping each request's path and outcome for the test to read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[str, str]] = []

    def compare(self, path, headers, body) -> str:
        outcome = super().compare(path, headers, body)
        self.seen.append((path, outcome))
        return outcome


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
    with Recording(replay) as running:
        listener = shadow.listener(running, "127.0.0.1", 0)
        thread = threading.Thread(target=listener.serve_forever, daemon=True)
        thread.start()
        address, stop = serve_metrics(running.registry)
        try:
            yield running, f"127.0.0.1:{listener.server_address[1]}", address
        finally:
            stop()
            listener.shutdown()
            listener.server_close()


@pytest.fixture(scope="module")
def gateway(server, canary, comparator, tmp_path_factory):
    """nginx with the rollout of embed at 0 %, every request of it copied to the comparator,
    and the exporter of its request log serving /metrics (its address last)."""
    shares = Shares(((embedding.ENSEMBLE, 0),))
    canaries = ((canary.http_url,), (canary.grpc_url,))
    rollout = Rollout(*canaries, shares, shadow=comparator[1], sample=SAMPLE)
    log_path = tmp_path_factory.mktemp("nginx") / "nginx.log"
    with Nginx(
        [server.http_url], [server.grpc_url], openai=OpenAI(), canary=rollout, log_path=log_path
    ) as nginx:
        exporter = ShapingLogExporter(nginx.shaping_log, interval=0.1).start()
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
    command = [sys.executable, "-m", "gateway.nginx", "rollout", "--file", str(nginx.rollout_path)]
    command += [*shares, "--sticky" if sticky else "--per-request"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def counted(exporter: ShapingLogExporter, version: str, protocol: str) -> float:
    """The exporter's admitted embed requests of one version over one protocol."""
    labels = {"gateway": "nginx", "tenant": "anonymous", "model": embedding.ENSEMBLE}
    labels |= {"protocol": protocol, "outcome": "admitted", "version": version}
    return exporter.registry.get_sample_value("gateway_requests_total", labels) or 0.0


def settled(exporter: ShapingLogExporter, total: float, protocols=("http", "grpc")) -> None:
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
