"""The consistent-hash ring, failover order and error classification of client/router.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client.router import AllShardsFailed, HashRing, Router, is_retryable
from server.launcher import free_port
from tests.helpers import REPO

SHARDS = ["shard-0", "shard-1", "shard-2"]
KEYS = [f"user-{i}" for i in range(10_000)]


def owners(ring: HashRing) -> dict[str, str]:
    return {k: ring.owner(k) for k in KEYS}


def test_each_of_three_shards_gets_a_fair_share_of_keys():
    shares = Counter(owners(HashRing(SHARDS)).values())
    assert set(shares) == set(SHARDS)
    for shard, count in shares.items():
        assert 0.25 <= count / len(KEYS) <= 0.42, (shard, count)


def test_the_same_key_maps_to_the_same_shard_in_a_fresh_process():
    sample = KEYS[:500]
    code = (
        "import json, sys; from client.router import HashRing; "
        f"ring = HashRing({SHARDS!r}); "
        f"print(json.dumps([ring.owner(k) for k in {sample!r}]))"
    )
    answers = []
    for seed in ("1", "2"):  # a different str-hash salt in each process
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        answers.append(json.loads(out.stdout))
    here = [HashRing(SHARDS).owner(k) for k in sample]
    assert answers[0] == answers[1] == here


@pytest.mark.parametrize("removed", SHARDS)
def test_removing_a_shard_moves_exactly_its_keys_to_their_next_shard(removed):
    ring = HashRing(SHARDS)
    before = owners(ring)
    walks = {k: ring.walk(k) for k in KEYS if before[k] == removed}
    ring.remove(removed)
    after = owners(ring)
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == set(walks)
    assert all(after[k] == walks[k][1] for k in moved)  # the ring successor, nothing else


def test_adding_a_shard_moves_only_keys_that_now_map_to_it():
    ring = HashRing(SHARDS)
    before = owners(ring)
    ring.add("shard-3")
    after = owners(ring)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "shard-3" for k in moved)
    assert [k for k in KEYS if after[k] == "shard-3"] == moved
    assert 0.15 <= len(moved) / len(KEYS) <= 0.35  # about 1/4


def test_removing_and_adding_back_restores_every_owner():
    ring = HashRing(SHARDS)
    before = owners(ring)
    ring.remove("shard-1")
    ring.add("shard-1")
    assert owners(ring) == before


def test_a_walk_visits_each_shard_once_owner_first():
    ring = HashRing(SHARDS)
    for key in KEYS[:1000]:
        walk = ring.walk(key)
        assert sorted(walk) == sorted(SHARDS)
        assert walk[0] == ring.owner(key)


def test_the_walk_without_a_shard_is_the_walk_with_it_minus_that_shard():
    ring, smaller = HashRing(SHARDS), HashRing(["shard-0", "shard-2"])
    for key in KEYS[:1000]:
        assert smaller.walk(key) == [s for s in ring.walk(key) if s != "shard-1"]


def test_ring_rejects_duplicates_and_answers_empty():
    ring = HashRing(["a"])
    with pytest.raises(ValueError, match="already"):
        ring.add("a")
    ring.remove("a")
    assert ring.walk("k") == []
    with pytest.raises(LookupError):
        ring.owner("k")


def closed_address() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there


def test_connection_failures_are_retryable_as_the_real_clients_raise_them():
    address = closed_address()
    with pytest.raises(InferenceServerException) as grpc_error:
        grpcclient.InferenceServerClient(address).is_server_ready(client_timeout=2)
    assert grpc_error.value.status() == "StatusCode.UNAVAILABLE"
    assert is_retryable(grpc_error.value)

    client = httpclient.InferenceServerClient(address, connection_timeout=2)
    try:
        with pytest.raises(ConnectionRefusedError) as http_error:
            client.is_server_ready()
    finally:
        client.close()
    assert is_retryable(http_error.value)


@pytest.mark.parametrize(
    ("status", "retry"),
    [
        # as tritonclient.grpc's get_error_grpc makes them: str(rpc_error.code())
        ("StatusCode.UNAVAILABLE", True),
        ("StatusCode.DEADLINE_EXCEEDED", True),
        ("StatusCode.INVALID_ARGUMENT", False),
        ("StatusCode.INTERNAL", False),
        ("StatusCode.NOT_FOUND", False),
        ("StatusCode.CANCELLED", False),
        # as tritonclient.http's _get_error makes them: str(response.status_code)
        ("400", False),
        ("404", False),
        ("500", False),
        ("502", True),
        ("503", True),
        ("504", True),
    ],
)
def test_triton_errors_are_retried_only_when_another_shard_may_succeed(status, retry):
    assert is_retryable(InferenceServerException(msg="from the server", status=status)) is retry


@pytest.mark.parametrize(
    ("status", "message", "retry"),
    [
        # what a SIGTERM'd server answers while it unloads its models: another shard has it
        (
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'embed' has no available versions",
            True,
        ),
        ("400", "Request for unknown model: 'embed' has no available versions", True),
        # a model no server has: every shard would say the same
        ("StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found", False),
        ("400", "Request for unknown model: 'nope' is not found", False),
    ],
)
def test_a_model_being_unloaded_is_retried_an_unknown_one_is_not(status, message, retry):
    assert is_retryable(InferenceServerException(msg=message, status=status)) is retry


def test_client_side_errors_are_not_retried():
    assert not is_retryable(ValueError("bad shape"))
    assert not is_retryable(KeyError("EMBEDDING"))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failing_request_tries_every_shard_once_in_ring_order(protocol):
    shards = {name: closed_address() for name in SHARDS}
    with Router(shards, protocol, health_interval=None, request_timeout=2) as router:
        # A key whose walk is neither the shards' own order nor its reverse: trying them in
        # the order they were given, or sorted, would show.
        key = next(k for k in KEYS if router.ring.walk(k) not in (SHARDS, SHARDS[::-1]))
        with pytest.raises(AllShardsFailed) as failed:
            router.infer(key, "embed", inputs=[])
        tried = failed.value.__cause__
        assert is_retryable(tried)
        walk = router.ring.walk(key)
        assert sorted(walk) == sorted(SHARDS)
        # The message lists the shards in the order they were tried.
        assert str(failed.value).startswith(
            f"key {key!r}: every shard tried failed ({', '.join(walk)}); last error: "
        ), str(failed.value)
        stats = router.stats()
        assert sum(s.requests for s in stats.values()) == len(SHARDS)
        for position, shard in enumerate(walk):
            assert stats[shard].requests == 1 and stats[shard].failures == 1
            assert stats[shard].retries == (position > 0)
            assert stats[shard].answered == 0
        assert router.live_shards() == []  # each failure marked its shard down


@pytest.mark.parametrize("max_attempts", [1, 2])
def test_max_attempts_bounds_the_walk(max_attempts):
    shards = {name: closed_address() for name in SHARDS}
    with Router(shards, "grpc", max_attempts=max_attempts, health_interval=None) as router:
        with pytest.raises(AllShardsFailed):
            router.infer("user-7", "embed", inputs=[])
        assert sum(s.requests for s in router.stats().values()) == max_attempts


def test_a_shard_that_fails_its_probe_goes_to_the_end_of_the_order():
    shards = {name: closed_address() for name in SHARDS}
    with Router(shards, "http", health_interval=None, probe_timeout=1) as router:
        key = next(k for k in KEYS if router.owner(k) == "shard-1")
        walk = router.ring.walk(key)
        assert router.route_order(key) == walk  # every shard taken as up at first
        assert router.check("shard-1") is False
        assert not router.is_up("shard-1")
        assert router.route_order(key) == [*walk[1:], "shard-1"]
        assert router.owner(key) == "shard-1"  # ownership does not change with health


class _Raising:
    """A client whose every infer raises ``exc``: what the router sees when a call ends so."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def infer(self, *args, **kwargs):
        raise self.exc

    def close(self):
        pass


@pytest.mark.parametrize(
    ("exc", "answered"),
    [
        (InferenceServerException("input TEXT is missing", status="400"), 1),
        (KeyboardInterrupt(), 0),
        (ValueError("bad shape, raised before sending"), 0),
    ],
)
def test_only_the_servers_own_refusal_counts_as_answered(monkeypatch, exc, answered):
    shards = {name: closed_address() for name in SHARDS}
    with Router(shards, "http", health_interval=None) as router:
        monkeypatch.setattr(router, "_client", lambda shard: _Raising(exc))
        with pytest.raises(type(exc)):
            router.infer("user-7", "embed", inputs=[])
        stats = router.stats()
        first = router.ring.walk("user-7")[0]
        assert stats[first].requests == 1 and stats[first].answered == answered
        assert sum(s.requests for s in stats.values()) == 1  # none of these is retried
