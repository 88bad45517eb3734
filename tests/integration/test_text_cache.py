"""The per-text cache against a real redis-server: shared between replicas, and never in the way.

Each fault is made for real: the server stopped, killed and started again on its port, put to
sleep (``DEBUG SLEEP``), filled to its ``maxmemory``, or asked with a wrong password. Every
lookup still answers (misses, which the step then encodes), within its timeout, and the failure
is counted by kind; the breaker stops the calls and lets one through once it has rested.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

import numpy as np
import pytest
import redis

from pipelines import text_cache
from server.redis import RedisServer
from tests.helpers import encoder_alone, stop_together

pytestmark = pytest.mark.integration

DIMS = 384
KEYSPACE = text_cache.Keyspace("encoder", "1", "a" * 64, "b" * 64, 256)
# The deadline of the tests whose subject is the deadline: roomier than the served 5 ms.
TIMEOUT_S = 0.2
# Everywhere else a call must not fail at all, or must fail for its own reason: on a busy core
# a new connection's connect and AUTH alone overran 0.4 s (2 x 0.2 s), a timeout that
# answered in place of the wrong password's "auth".
ROOMY_S = 5.0


def vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIMS)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def cache(url: str | None, local_bytes: int = 1 << 20, **shared) -> text_cache.TextCache:
    layer = None
    if url:
        options = {"timeout_s": ROOMY_S, "breaker_failures": 3, "breaker_reset_s": 0.5}
        layer = text_cache.SharedLayer(url, **{**options, **shared})
    return text_cache.TextCache(KEYSPACE, DIMS, text_cache.LocalLayer(local_bytes), layer)


@pytest.fixture
def redis_server():
    with RedisServer(extra_args=("--enable-debug-command", "local")) as server:
        yield server


def test_what_one_replica_stores_the_other_finds_and_duplicates_cost_one_lookup(redis_server):
    texts = ["a man is eating food", "a horse", "a man is eating food", "café ☕"]
    first, second = cache(redis_server.url), cache(redis_server.url)
    found, outcome = first.lookup(texts)
    assert found == [None] * 4 and outcome.misses == 3 and not outcome.errors  # 3 distinct
    unique = list(dict.fromkeys(texts))
    stored = vectors(len(unique))
    assert first.store(unique, stored, [7, 4, 6]).errors == {}

    # The other replica's process has never seen them: Redis answers, its LRU keeps them.
    found, outcome = second.lookup(texts)
    assert (outcome.shared_hits, outcome.local_hits, outcome.misses) == (4, 0, 0)
    by_text = dict(zip(unique, stored, strict=True))
    for text, (vector, _) in zip(texts, found, strict=True):
        np.testing.assert_array_equal(vector, by_text[text])  # the same bytes, not close ones
    assert [n for _, n in found] == [7, 4, 7, 6]
    _, again = second.lookup(texts)
    assert (again.local_hits, again.shared_hits) == (4, 0)
    assert len(again.redis_seconds) == 0  # all local: no round trip


def test_keys_hold_no_text_and_another_encoder_never_sees_these_vectors(redis_server):
    texts = ["a very private sentence"]
    cache(redis_server.url).store(texts, vectors(1), [5])
    raw = redis.Redis.from_url(redis_server.url)
    (key,) = raw.keys("*")
    assert b"private" not in key and b"private" not in raw.get(key)
    assert 0 < raw.ttl(key) <= 7 * 24 * 3600
    other = text_cache.Keyspace("encoder", "1", "c" * 64, "b" * 64, 256)  # a new export
    shared = text_cache.SharedLayer(redis_server.url, timeout_s=TIMEOUT_S)
    found, outcome = text_cache.TextCache(other, DIMS, None, shared).lookup(texts)
    assert found == [None] and outcome.misses == 1


def test_a_value_that_does_not_decode_is_counted_and_recomputed(redis_server):
    texts = ["one", "two"]
    c = cache(redis_server.url, local_bytes=0)
    c.store(texts, vectors(2), [3, 3])
    raw = redis.Redis.from_url(redis_server.url)
    keys = KEYSPACE.keys(texts)
    raw.set(keys[0], b"\x02" + raw.get(keys[0])[1:])  # another format version
    raw.set(keys[1], raw.get(keys[1])[:-4])  # one float short
    found, outcome = cache(redis_server.url, local_bytes=0).lookup(texts)
    assert found == [None, None] and outcome.corrupt == 2 and outcome.misses == 2


def test_the_local_layer_stays_within_its_bytes():
    c = cache(None, local_bytes=20 * (5 + 4 * DIMS))
    texts = [f"text {i}" for i in range(100)]
    c.store(texts, vectors(100), [3] * 100)
    assert c.local.entries.currsize <= 20 * (5 + 4 * DIMS)
    found, outcome = c.lookup(texts)
    assert outcome.local_hits == 20 and found[-1] is not None and found[0] is None


def bounded_lookup(c: text_cache.TextCache, texts: list[str]):
    started = time.monotonic()
    found, outcome = c.lookup(texts)
    return found, outcome, time.monotonic() - started


def test_a_stopped_killed_and_restarted_redis_costs_misses_then_serves_again(tmp_path):
    texts = [f"fault {i}" for i in range(8)]
    server = RedisServer().start()
    port, password = server.port, server.password
    # Refused and reset connections fail at once, far within any timeout: the roomy one keeps
    # the calls that must succeed (the first connections after each start) from timing out.
    c = cache(server.url, local_bytes=0)
    try:
        c.store(texts, vectors(8), [4] * 8)
        server.stop()
        for _ in range(3):  # refused connections: each a miss within the timeout, counted
            found, outcome, took = bounded_lookup(c, texts)
            assert found == [None] * 8 and outcome.errors and took < 1.0
        assert c.shared.open  # three failures in a row
        found, outcome, took = bounded_lookup(c, texts)
        # Refused by the open breaker, which never calls Redis (no wall-clock bound: a busy
        # machine can take 10 ms for anything).
        assert outcome.errors == {"breaker_open": 1}

        server = RedisServer(port=port, password=password).start()  # empty: it kept nothing
        time.sleep(0.6)  # the breaker rests, then lets one call through
        found, outcome = c.lookup(texts)
        assert outcome.misses == 8 and not outcome.errors and not c.shared.open
        c.store(texts, vectors(8), [4] * 8)
        server.kill()  # SIGKILL mid-use, as a crash would
        found, outcome, took = bounded_lookup(c, texts)
        assert found == [None] * 8 and took < 1.0
        server = RedisServer(port=port, password=password).start()
        time.sleep(0.6)
        c.store(texts, vectors(8), [4] * 8)
        found, outcome = c.lookup(texts)
        assert outcome.shared_hits == 8
    finally:
        server.stop()


def asleep(url: str, within_s: float = 10.0) -> None:
    """Return once Redis is inside its DEBUG SLEEP: a PING goes unanswered for 0.5 s."""
    probe = redis.Redis.from_url(url, socket_timeout=0.5)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            probe.ping()
        except redis.TimeoutError:
            return
        time.sleep(0.02)
    raise AssertionError("Redis never went to sleep")


def test_a_slow_redis_costs_its_timeout_not_its_sleep(redis_server):
    texts = ["slow one", "slow two"]
    c = cache(redis_server.url, local_bytes=0, timeout_s=TIMEOUT_S)
    c.store(texts, vectors(2), [3, 3])
    sleeper = threading.Thread(
        target=lambda: redis.Redis.from_url(redis_server.url).execute_command("DEBUG", "SLEEP", 3)
    )
    sleeper.start()
    asleep(redis_server.url)
    try:
        found, outcome, took = bounded_lookup(c, texts)
    finally:
        sleeper.join()
    assert found == [None, None] and outcome.errors == {"timeout": 1}
    assert took < 1.5  # the timeout, not the three seconds of sleep


def test_a_name_lookup_that_hangs_costs_the_deadline_and_opens_the_breaker(monkeypatch):
    """A Redis cut off its network: Docker's DNS hangs on its name for seconds (seen in
    test_containers), before any socket timeout applies. Every lookup still answers in time."""
    import socket

    real = socket.getaddrinfo
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda *a, **k: time.sleep(3) or real(*a, **k)
    )  # fmt: skip
    c = cache("redis://cut-off.invalid:6379/0", local_bytes=0, timeout_s=TIMEOUT_S)
    outcomes = []
    for _ in range(5):
        found, outcome, took = bounded_lookup(c, ["a text"])
        assert found == [None] and took < 1.5  # the deadline, not the three seconds
        outcomes.append(outcome.errors)
    # The first call overruns; the next ones do not queue behind it; the third failure opens
    # the breaker (pybreaker reports that one as the opening).
    assert outcomes == [{"timeout": 1}] * 2 + [{"breaker_open": 1}] * 3


def test_a_full_redis_refuses_stores_and_the_answers_go_on():
    with RedisServer(maxmemory="1mb", policy="noeviction") as server:
        c = cache(server.url, local_bytes=0)
        kinds: dict[str, int] = {}
        for i in range(40):  # 40 × 50 vectors × 1.5 KB: well past 1 MB
            texts = [f"filler {i} {j}" for j in range(50)]
            outcome = c.store(texts, vectors(50, seed=i), [3] * 50)
            for kind, n in outcome.errors.items():
                kinds[kind] = kinds.get(kind, 0) + n
            if c.shared.open:
                break
        assert kinds.get("full", 0) >= 1
        # Lookups go on: what was stored before Redis filled up is still served from it, once
        # the breaker (which the refused stores may have opened) lets calls through again.
        deadline = time.monotonic() + 10
        while True:
            found, outcome = c.lookup(["filler 0 0", "never stored"])
            if not outcome.errors or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not outcome.errors and outcome.shared_hits == 1 and found[1] is None, outcome
        (vector, tokens), _ = found
        np.testing.assert_array_equal(vector, vectors(50, seed=0)[0])
        assert tokens == 3


def test_a_wrong_password_is_counted_as_such(redis_server):
    url = redis_server.url.replace(redis_server.password, "not-the-password")
    found, outcome = cache(url, local_bytes=0).lookup(["x"])
    assert found == [None] and outcome.errors == {"auth": 1}


# Served: two replicas behind the gateway's nginx, one Redis --------------------------------------
LAYERS = {"model": "tokenize_encode", "version": "1"}


@pytest.fixture(scope="module")
def replicas(encoder_onnx):
    """A Redis, two tritonservers (embed only) sharing it, and nginx in front of both."""
    from gateway.nginx.config import Gateway, Upstreams
    from gateway.nginx.process import Nginx
    from server import Server, ServerConfig

    with contextlib.ExitStack() as stack:
        cache_server = stack.enter_context(RedisServer())
        servers = []
        for _ in range(2):
            config = ServerConfig(
                http_port=0, grpc_port=0, metrics_port=0, text_cache_url=cache_server.url,
                extra_args=["--model-control-mode=explicit", "--load-model=embed"],
            )  # fmt: skip
            servers.append(stack.enter_context(Server(config)))
        stack.callback(stop_together, *servers)
        nginx = stack.enter_context(Nginx(Gateway(Upstreams.of(*servers))))
        state = {"redis": cache_server, "servers": servers, "nginx": nginx}
        # A test that restarts Redis puts the new one here: it is stopped with the rest.
        stack.callback(lambda: state["redis"] is not cache_server and state["redis"].stop())
        yield state


@pytest.fixture(scope="module")
def uncached(encoder_onnx):
    """Each text's vector from the encoder alone, in this process: what the cache must return."""
    return encoder_alone(encoder_onnx[0])


def embed_via(url: str, texts: list[str], user: str | None = None) -> np.ndarray:
    """One embed request of ``texts`` over HTTP (through nginx: hashed by ``user``)."""
    import tritonclient.http as http

    from pipelines import embedding

    with http.InferenceServerClient(url) as client:
        tensor = http.InferInput(embedding.TEXT, [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], np.object_)[:, None])
        headers = {"X-User-Id": user} if user else None
        return client.infer(embedding.ENSEMBLE, [tensor], headers=headers).as_numpy(
            embedding.EMBEDDING
        )


def assert_as_uncached(vectors: np.ndarray, expected: np.ndarray) -> None:
    cosines = (vectors * expected).sum(1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert cosines.min() >= 0.999999, cosines.min()


def test_texts_one_replica_embedded_are_redis_hits_on_the_other(replicas, uncached):
    from tests.helpers import change, scrape

    servers, nginx = replicas["servers"], replicas["nginx"]
    texts = [f"shared across replicas, text {i}" for i in range(24)]
    before = [scrape(s) for s in servers]
    # Through the gateway, each request hashed by its own user: both replicas get some. The
    # second text of each request is the first one again: encoded once, answered twice.
    for i, text in enumerate(texts):
        vectors = embed_via(nginx.http_url, [text, text], user=f"user-{i}")
        np.testing.assert_array_equal(vectors[0], vectors[1])
        assert_as_uncached(vectors, uncached([text, text]))
    middle = [scrape(s) for s in servers]
    encoded = [change(b, m, "pipeline_text_cache_misses_total", **LAYERS) for b, m in
               zip(before, middle, strict=True)]  # fmt: skip
    assert sum(encoded) == len(texts) and min(encoded) > 0, encoded  # each text once, both used

    # Then every text to each replica itself, in requests of eight: nothing encoded again. A
    # replica has the texts it encoded in its own LRU, the others from Redis.
    for server in servers:
        for start in range(0, len(texts), 8):
            batch = texts[start : start + 8]
            assert_as_uncached(embed_via(server.http_url, batch), uncached(batch))
    after = [scrape(s) for s in servers]
    # The served call timeout is 5 ms: on a busy machine a store or a lookup can overrun it,
    # and the texts of that call (at most a request's eight) are then encoded again, on either
    # replica. Every such miss must come with a counted timeout; with none, nothing may be.
    missed = [
        change(m, a, "pipeline_text_cache_misses_total", **LAYERS)
        for m, a in zip(middle, after, strict=True)
    ]
    timeouts = sum(
        change(b, a, "pipeline_text_cache_errors_total", **LAYERS, kind="timeout")
        for b, a in zip(before, after, strict=True)
    )
    assert sum(missed) <= 8 * timeouts, (missed, timeouts)
    from_redis = 0
    for server_before, server_after, mine, miss in zip(middle, after, encoded, missed, strict=True):
        hits = {
            layer: change(server_before, server_after, "pipeline_text_cache_hits_total",
                          **LAYERS, layer=layer)
            for layer in ("local", "redis")
        }  # fmt: skip
        assert hits["local"] == mine and hits["redis"] == len(texts) - mine - miss, hits
        from_redis += hits["redis"]
    # And Redis did serve: each replica asked it for the texts the other encoded, 24 together.
    # A timed-out call costs at most one request's eight, so a cache whose every call times out
    # (each miss then excused by its timeout above) fails here; the counts seen on a busy
    # machine: docs/operations.md#the-per-text-embedding-cache.
    assert from_redis >= len(texts) // 2, (from_redis, missed, timeouts)


def test_a_redis_killed_mid_load_costs_hits_never_an_answer(replicas, uncached):
    from tests.helpers import change, scrape, value

    server, old = replicas["servers"][0], replicas["redis"]
    seen = [f"under load {i}" for i in range(16)]
    answered, wrong, failed = [], [], []
    stop = threading.Event()

    def load(worker: int) -> None:
        # Two texts seen before and two new ones per request: every request asks Redis.
        for n in itertools.count():
            if stop.is_set():
                return
            batch = [seen[(worker * 5 + n + k) % len(seen)] for k in range(2)]
            batch += [f"new under load {worker}-{n}-{k}" for k in range(2)]
            try:
                vectors = embed_via(server.http_url, batch)
            except Exception as exc:  # noqa: BLE001 - the test counts every failure
                failed.append(repr(exc))
                continue
            expected = uncached(batch)
            cosines = (vectors * expected).sum(1)  # unit vectors
            (answered if cosines.min() >= 0.999999 else wrong).append(batch)

    before = scrape(server)
    workers = [threading.Thread(target=load, args=(w,)) for w in range(3)]
    for w in workers:
        w.start()
    try:
        time.sleep(1.5)
        old.kill()  # as a crash would: connections reset, nothing said
        time.sleep(2.0)
        replicas["redis"] = RedisServer(port=old.port, password=old.password).start()
        # The served breaker rests 10 s before it lets a call through again.
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            page = scrape(server)
            if value(page, "pipeline_text_cache_breaker_open", **LAYERS) == 0 and change(
                before, page, "pipeline_text_cache_errors_total", **LAYERS, kind="connection"
            ) + change(
                before, page, "pipeline_text_cache_errors_total", **LAYERS, kind="breaker_open"
            ):
                break
            time.sleep(0.5)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    after = scrape(server)
    assert failed == [] and wrong == [] and len(answered) > 20
    errors = sum(
        change(before, after, "pipeline_text_cache_errors_total", **LAYERS, kind=kind)
        for kind in ("connection", "timeout", "breaker_open")
    )
    assert errors >= 1  # the outage was seen, and counted
    assert value(after, "pipeline_text_cache_breaker_open", **LAYERS) == 0  # closed again
    # After the restart the new, empty Redis fills again and serves the other replica.
    other = replicas["servers"][1]
    fresh = [f"after the restart {i}" for i in range(4)]
    embed_via(server.http_url, fresh)
    other_before = scrape(other)
    assert_as_uncached(embed_via(other.http_url, fresh), uncached(fresh))
    assert change(other_before, scrape(other), "pipeline_text_cache_hits_total", **LAYERS,
                  layer="redis") == len(fresh)  # fmt: skip
