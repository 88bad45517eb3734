"""Sharding over three real tritonservers: the key router (HTTP, gRPC) and nginx in front.

Every load here is bounded: threads stop by themselves at a hard deadline, and each test
counts every request sent and every answer received.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from client import connection
from client.embed import build_inputs
from client.router import Router, is_retryable
from gateway.nginx.config import (
    USER_ID_HEADER,
    Gateway,
    Listen,
    Upstreams,
    check_config,
    render,
)
from gateway.nginx.process import Nginx
from pipelines import embedding
from server import Server, ServerConfig
from tests.helpers import stop_together

pytestmark = pytest.mark.integration

log = logging.getLogger(__name__)

NAMES = ("shard-0", "shard-1", "shard-2")
# Only the embed pipeline: three servers stay light on two cores.
EXTRA_ARGS = ["--model-control-mode=explicit", f"--load-model={embedding.ENSEMBLE}"]
USERS = [f"user-{i}" for i in range(300)]
LOAD_THREADS = 4
HARD_DEADLINE_S = 60.0  # no load in this module may run longer, whatever happens


def text_of(user: str) -> str:
    # One text per user: after its first request a user is a response-cache hit on its
    # shard, which keeps the load cheap; a user answered elsewhere misses that shard's cache.
    return f"what {user} asked for"


# Cluster ------------------------------------------------------------------------------------
@dataclass
class Cluster:
    """Three tritonservers by shard name; a server can be stopped, killed and started again."""

    log_dir: Path
    servers: dict[str, Server] = field(default_factory=dict)
    starts: Counter = field(default_factory=Counter)

    def _start(self, name: str, ports: tuple[int, int, int] = (0, 0, 0)) -> Server:
        self.starts[name] += 1
        http, grpc, metrics = ports
        config = ServerConfig(
            http_port=http, grpc_port=grpc, metrics_port=metrics, extra_args=EXTRA_ARGS
        )
        log_path = self.log_dir / f"{name}-{self.starts[name]}.log"
        server = Server(config, log_path=log_path).start(timeout=120)
        self.servers[name] = server
        return server

    def start_all(self) -> None:
        with ThreadPoolExecutor(len(NAMES)) as pool:
            list(pool.map(self._start, NAMES))

    def running(self, name: str) -> bool:
        process = self.servers[name].process
        return process is not None and process.poll() is None

    def restart(self, name: str) -> Server:
        """A new server on the same ports (the router and nginx know those addresses)."""
        c = self.servers[name].config
        return self._start(name, (c.http_port, c.grpc_port, c.metrics_port))

    def ensure_all_up(self) -> None:
        for name in NAMES:
            if not self.running(name):
                self.restart(name)

    def kill(self, name: str) -> float:
        """SIGKILL the server and its Python-backend stubs, as a crash would; returns when."""
        return self.servers[name].kill()

    def urls(self, protocol: str) -> dict[str, str]:
        servers = {n: self.servers[n] for n in NAMES}
        return {n: (s.http_url if protocol == "http" else s.grpc_url) for n, s in servers.items()}

    def successes(self, name: str) -> int:
        """Successful embed requests the server has counted (cache hits included)."""
        return embed_stats(self.servers[name])["success"]

    def settled_delta(self, before: dict[str, int], sent: int) -> dict[str, int]:
        """Each server's successes since ``before``, once they add up to ``sent`` (Triton counts
        a request as it releases it, which can trail the answer) or 10 s have passed."""
        deadline = time.monotonic() + 10
        while True:
            delta = {n: self.successes(n) - before[n] for n in before}
            if sum(delta.values()) >= sent or time.monotonic() > deadline:
                return delta
            time.sleep(0.05)

    def stop_all(self) -> None:
        stop_together(*self.servers.values())


def embed_stats(server: Server) -> dict[str, int]:
    import tritonclient.http as http

    with http.InferenceServerClient(server.http_url) as client:
        (stats,) = client.get_inference_statistics(embedding.ENSEMBLE)["model_stats"]
    return {k: int(stats["inference_stats"][k]["count"]) for k in ("success", "fail")}


@pytest.fixture(scope="module")
def cluster(encoder_onnx, tmp_path_factory):
    started = time.monotonic()
    cluster = Cluster(tmp_path_factory.mktemp("shards"))
    try:
        cluster.start_all()
        log.info("3 servers ready in %.1f s", time.monotonic() - started)
        yield cluster
    finally:
        cluster.stop_all()


# Load ---------------------------------------------------------------------------------------
@dataclass
class Answer:
    started: float
    user: str
    shard: str | None
    attempts: int


class Load:
    """LOAD_THREADS threads sending requests for ``USERS`` round robin until stopped.

    ``send(user)`` makes one request and returns the shard that answered (or None if it
    cannot tell). Every request is counted as sent, then as answered or failed.
    """

    def __init__(self, send: Callable[[str], tuple[str | None, int]], threads: int = LOAD_THREADS):
        self.send = send
        self.sent = self.answered = 0
        self.failures: list[tuple[float, str]] = []  # (started, what)
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + HARD_DEADLINE_S
        self._threads = [
            threading.Thread(target=self._run, args=(i, threads), daemon=True)
            for i in range(threads)
        ]

    def _run(self, index: int, stride: int) -> None:
        n = index
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            user = USERS[n % len(USERS)]
            n += stride
            started = time.monotonic()
            with self._lock:
                self.sent += 1
            try:
                shard, attempts = self.send(user)
            except Exception as exc:  # noqa: BLE001 - every failure is recorded and asserted on
                with self._lock:
                    self.failures.append((started, f"{user}: {type(exc).__name__}: {exc}"))
                continue
            with self._lock:
                self.answered += 1
                self.answers.append(Answer(started, user, shard, attempts))

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=max(1.0, self._deadline - time.monotonic() + 30))
        hung = [t.name for t in self._threads if t.is_alive()]
        assert not hung, f"load threads still running (a request hung): {hung}"


def router_sender(router: Router):
    """A Load sender over ``router`` with HTTP/gRPC inputs built per request."""
    outputs_names = [embedding.EMBEDDING]

    def send(user: str) -> tuple[str, int]:
        inputs = build_inputs(router.mod, [text_of(user)])
        outputs = connection.make_outputs(router.mod, outputs_names)
        routed = router.route(user, embedding.ENSEMBLE, inputs, outputs)
        assert routed.result.as_numpy(embedding.EMBEDDING).shape == (1, embedding.HIDDEN_SIZE)
        return routed.shard, len(routed.attempts)

    return send


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``condition()`` held; fails the test after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - started


# (a) Routing by key -------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_key_lands_on_its_owner_shard(cluster, protocol):
    cluster.ensure_all_up()
    users = USERS[:60]
    with Router(cluster.urls(protocol), protocol, health_interval=None) as router:
        send = router_sender(router)
        before = {n: cluster.successes(n) for n in NAMES}
        for user in users:
            for _ in range(2):
                shard, attempts = send(user)
                assert (shard, attempts) == (router.owner(user), 1)
        after = {n: cluster.successes(n) for n in NAMES}
        expected = Counter(router.owner(u) for u in users for _ in range(2))
        # The servers' own statistics agree with the ring, request for request.
        assert {n: after[n] - before[n] for n in NAMES} == {n: expected[n] for n in NAMES}
        assert all(expected[n] > 0 for n in NAMES)
        stats = router.stats()
        assert {n: s.answered for n, s in stats.items()} == {n: expected[n] for n in NAMES}
        assert all(s.retries == s.failures == 0 for s in stats.values())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_bad_request_is_refused_once_and_not_retried(cluster, protocol):
    cluster.ensure_all_up()
    user = "user-bad"
    with Router(cluster.urls(protocol), protocol, health_interval=None) as router:
        before = {n: embed_stats(cluster.servers[n]) for n in NAMES}
        with pytest.raises(InferenceServerException) as refused:
            router.infer(user, embedding.ENSEMBLE, build_inputs(router.mod, [b""]))
        after = {n: embed_stats(cluster.servers[n]) for n in NAMES}
        assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        assert "empty text" in refused.value.message()
        owner = router.owner(user)
        stats = router.stats()
        assert sum(s.requests for s in stats.values()) == 1
        assert stats[owner].requests == stats[owner].answered == 1
        assert router.live_shards() == list(NAMES)  # a bad request says nothing about health
        fails = {n: after[n]["fail"] - before[n]["fail"] for n in NAMES}
        # Only the owner saw it (Triton 2.51 counts one failed ensemble request twice here).
        assert {n for n, f in fails.items() if f} == {owner}


# (b) + (c) A server stops under load, then comes back ---------------------------------------
@pytest.mark.parametrize(
    ("protocol", "victim", "how"),
    [
        ("http", "shard-1", "sigterm"),
        ("http", "shard-0", "sigkill"),
        ("grpc", "shard-2", "sigterm"),
        ("grpc", "shard-1", "sigkill"),
    ],
)
def test_failover_and_rejoin_under_load(cluster, protocol, victim, how):
    cluster.ensure_all_up()
    router = Router(
        cluster.urls(protocol),
        protocol,
        health_interval=0.25,
        probe_timeout=0.5,
        request_timeout=10,
    )
    marks: dict[str, float] = {}
    with router, Load(router_sender(router)) as load:
        time.sleep(1.5)  # everyone up: the baseline
        marks["stop"] = time.monotonic()
        if how == "sigkill":
            cluster.kill(victim)
        else:
            # Triton stops taking part once SIGTERM'd: readiness goes false, the router's
            # health check routes away, in-flight requests finish, the server exits.
            stopper = threading.Thread(target=cluster.servers[victim].stop)
            stopper.start()
        down_after = wait_for(lambda: not router.is_up(victim), 10, f"{victim} marked down")
        marks["down"] = time.monotonic()
        if how == "sigterm":
            stopper.join(40)
            assert not stopper.is_alive()
        marks["exited"] = time.monotonic()
        time.sleep(1.0)  # the victim's keys served by their successors
        answered_before_restart = router.stats()[victim].answered
        marks["restart"] = time.monotonic()
        cluster.restart(victim)
        marks["ready"] = time.monotonic()
        rejoin_after = wait_for(lambda: router.is_up(victim), 10, f"{victim} back in rotation")
        marks["up"] = time.monotonic()
        time.sleep(1.5)  # the victim's keys back on it
    stats = router.stats()

    assert load.failures == []
    assert load.sent == load.answered == len(load.answers) > 0
    owners = {u: router.owner(u) for u in USERS}
    successor = {u: router.ring.walk(u)[1] for u in USERS}
    served_by: dict[str, set[str]] = defaultdict(set)
    for a in load.answers:
        served_by[a.user].add(a.shard)
    # No key of a live shard ever moved; the victim's keys went only to their ring successor.
    for user, shards in served_by.items():
        if owners[user] != victim:
            assert shards == {owners[user]}, user
        else:
            assert shards <= {victim, successor[user]}, user
    victims = [a for a in load.answers if owners[a.user] == victim]
    while_down = [a for a in victims if marks["down"] < a.started < marks["restart"]]
    after_rejoin = [a for a in victims if a.started > marks["up"]]
    assert while_down and all(a.shard == successor[a.user] for a in while_down)
    assert after_rejoin and all(a.shard == victim for a in after_rejoin)
    # The restarted server's own count: exactly what the router sent it since it came back.
    assert cluster.successes(victim) == stats[victim].answered - answered_before_restart

    log.warning(
        "%s/%s: sent %d, answered %d, failed %d; attempts>1: %d; victim failures %d, "
        "retries by shard %s; marked down %.2f s after the %s, server exited after %.2f s, "
        "restart→ready %.1f s, ready→back in rotation %.2f s; victim's keys: %d answers while "
        "down (all by successors), %d after rejoin (all by the victim)",
        protocol,
        how,
        load.sent,
        load.answered,
        len(load.failures),
        sum(a.attempts > 1 for a in load.answers),
        stats[victim].failures,
        {n: s.retries for n, s in stats.items()},
        down_after,
        how,
        marks["exited"] - marks["stop"],
        marks["ready"] - marks["restart"],
        rejoin_after,
        len(while_down),
        len(after_rejoin),
    )


# (d) nginx in front -------------------------------------------------------------------------
def test_rendered_nginx_config_passes_nginx_t(nginx_binary):
    upstreams = Upstreams(
        http=("127.0.0.1:9000", "127.0.0.1:9010"), grpc=("127.0.0.1:9001", "127.0.0.1:9011")
    )
    text = render(Gateway(upstreams, Listen(18000, 18001)))
    check_config(text, nginx_binary)
    for needed in (
        "server 127.0.0.1:9000 max_fails=1",
        "server 127.0.0.1:9011 max_fails=1",
        "hash $http_x_user_id consistent;",
        "grpc_pass grpc://triton_grpc;",
        "listen 127.0.0.1:18001 http2;",
        "non_idempotent;",
        "client_max_body_size 64m;",
    ):
        assert needed in text


def nginx_sender(protocol: str, url: str):
    """A Load sender through nginx: one client per thread, the user id as a header.

    A retryable failure (``client.router.is_retryable``) is sent once more and recorded in
    ``send.retried`` as (sent, failed, message), monotonic s: nginx cannot resend a gRPC
    request whose body it already streamed to a server that then died, so that one comes back
    as UNAVAILABLE (HTTP/2 status 502).
    """
    mod = connection.module(protocol)
    local = threading.local()
    made: list = []
    retried: list[tuple[float, float, str]] = []

    def send(user: str) -> tuple[None, int]:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = mod.InferenceServerClient(url)
            made.append(client)
        header = USER_ID_HEADER if protocol == "http" else USER_ID_HEADER.lower()
        kwargs = {"client_timeout": 10} if protocol == "grpc" else {}
        for attempt in (1, 2):
            started = time.monotonic()
            try:
                result = client.infer(
                    embedding.ENSEMBLE,
                    build_inputs(mod, [text_of(user)]),
                    outputs=connection.make_outputs(mod, [embedding.EMBEDDING]),
                    headers={header: user},
                    **kwargs,
                )
            except Exception as exc:
                if attempt == 2 or not is_retryable(exc):
                    raise
                retried.append((started, time.monotonic(), str(exc)))
                continue
            assert result.as_numpy(embedding.EMBEDDING).shape == (1, embedding.HIDDEN_SIZE)
            return None, attempt
        raise AssertionError("unreachable")

    send.clients = made
    send.retried = retried
    return send


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_nginx_shards_by_user_header_and_survives_a_dead_upstream(cluster, nginx_binary, protocol):
    cluster.ensure_all_up()
    servers = [cluster.servers[n] for n in NAMES]
    proxy = Nginx(Gateway(Upstreams.of(*servers)))
    with proxy:
        url = proxy.http_url if protocol == "http" else proxy.grpc_url
        send = nginx_sender(protocol, url)
        # Sticky: every request of one user reaches one upstream (the servers' statistics).
        upstream_of = {}
        for user in USERS[:12]:
            before = {n: cluster.successes(n) for n in NAMES}
            for _ in range(3):
                send(user)
            delta = cluster.settled_delta(before, 3)
            assert sorted(delta.values()) == [0, 0, 3], (user, delta)
            upstream_of[user] = next(n for n, d in delta.items() if d == 3)
        assert len(set(upstream_of.values())) >= 2, upstream_of

        # Kill the upstream of the first user while load runs through nginx.
        victim = upstream_of[USERS[0]]
        with Load(send) as load:
            time.sleep(1.0)
            killed = cluster.kill(victim)
            gone = time.monotonic()  # kill() returns once the server has been reaped
            time.sleep(2.5)
        for client in send.clients:
            client.close()
        log.warning(
            "nginx %s: %d requests sent, %d answered, %d failed; %d retried by the client %s; "
            "%s killed during the load",
            protocol,
            load.sent,
            load.answered,
            len(load.failures),
            len(send.retried),
            [(round(t - killed, 3), round(f - killed, 3), m) for t, f, m in send.retried],
            victim,
        )
        assert load.failures == []
        assert load.sent == load.answered > 0
        if protocol == "http":
            assert send.retried == []  # nginx resent every one itself
        else:
            # Only requests already on their way when the server died, at most one per thread:
            # sent before the killed server was gone (reaped, its sockets closed) and failed
            # after the kill signal. Everything sent later was moved to another server by
            # nginx alone.
            assert len(send.retried) <= LOAD_THREADS, proxy.log_tail()
            in_flight = all(t < gone and f > killed and "502" in m for t, f, m in send.retried)
            assert in_flight, (send.retried, killed, gone, proxy.log_tail())
