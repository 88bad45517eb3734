"""Client-side sharding over several tritonservers: consistent hashing, health checks, failover.

A request key (a user id, a tenant) picks a shard on a consistent-hash ring, so the same key
always lands on the same server (its response cache and any per-user state stay warm there),
and adding or removing a shard moves only the keys that shard gains or loses. When the owner
is down, or fails at the connection level, the request goes to the next distinct shard of the
ring walk; a bad request (``INVALID_ARG``, HTTP 400) is never retried, since every shard
would refuse it the same way.

Example:
    shards = {"a": "10.0.0.1:8001", "b": "10.0.0.2:8001", "c": "10.0.0.3:8001"}
    with Router(shards, protocol="grpc") as router:
        inputs = embed.build_inputs(router.mod, ["hello"])
        outputs = connection.make_outputs(router.mod, ["EMBEDDING"])
        result = router.infer("user-42", "embed", inputs, outputs)

For a Python caller that spreads its own requests over several servers with no proxy in
between. Traffic shaping (token buckets per tenant and model) is the gateway's job, not this
module's: put ``python -m gateway.nginx`` in front of the servers where callers must be held to
a rate.
"""

from __future__ import annotations

import bisect
import hashlib
import http.client
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonclient.utils import InferenceServerException

from client import connection

__all__ = [
    "AllShardsFailed",
    "HashRing",
    "Routed",
    "Router",
    "ShardStats",
    "is_retryable",
]

log = logging.getLogger(__name__)

DEFAULT_VNODES = 160
# gRPC codes after which another shard may well succeed: the server is gone, shutting down or
# hung. INVALID_ARGUMENT, INTERNAL (the model failed on this input), NOT_FOUND... are the
# request's own fault or deterministic, so retrying them would only repeat the error N times.
RETRYABLE_GRPC = frozenset({"StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"})
# HTTP statuses with the same meaning: Triton answers UNAVAILABLE with 503, and a proxy in
# between answers 502/504 when the server behind it is gone.
RETRYABLE_HTTP = frozenset({"502", "503", "504"})
# Triton's answer (gRPC NOT_FOUND, HTTP 400) for a model it knows but no longer serves: seen
# for requests that arrive while a SIGTERM'd server unloads its models. Another shard still has
# the model; a name that no server knows gets "... is not found" instead and is not retried.
MODEL_UNLOADING = "has no available versions"


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash()`` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


class HashRing:
    """A consistent-hash ring with ``vnodes`` points per shard.

    Virtual nodes spread each shard over the ring, so the shares stay near 1/N and a removed
    shard's keys are spread over all the others instead of landing on one neighbour.
    """

    def __init__(self, shards: Iterable[str] = (), vnodes: int = DEFAULT_VNODES):
        if vnodes < 1:
            raise ValueError("vnodes must be >= 1")
        self.vnodes = vnodes
        self._points: list[int] = []  # sorted hashes
        self._owners: list[str] = []  # shard of each point, same order
        self._shards: list[str] = []
        for shard in shards:
            self.add(shard)

    @property
    def shards(self) -> list[str]:
        """The shards on the ring, in the order they were added."""
        return list(self._shards)

    def add(self, shard: str) -> None:
        """Put ``shard`` on the ring (its points depend only on its name)."""
        if shard in self._shards:
            raise ValueError(f"shard {shard!r} is already on the ring")
        self._shards.append(shard)
        for i in range(self.vnodes):
            point = stable_hash(f"{shard}#{i}")
            at = bisect.bisect(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, shard)

    def remove(self, shard: str) -> None:
        """Take ``shard`` off the ring; only its keys move (to their next shard)."""
        if shard not in self._shards:
            raise KeyError(shard)
        self._shards.remove(shard)
        kept = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != shard]
        self._points = [p for p, _ in kept]
        self._owners = [o for _, o in kept]

    def walk(self, key: str) -> list[str]:
        """Every shard once, in ring order from ``key``'s position: owner first, then fallbacks."""
        if not self._points:
            return []
        start = bisect.bisect(self._points, stable_hash(key))
        order: list[str] = []
        for i in range(len(self._points)):
            shard = self._owners[(start + i) % len(self._points)]
            if shard not in order:
                order.append(shard)
                if len(order) == len(self._shards):
                    break
        return order

    def owner(self, key: str) -> str:
        """The shard that owns ``key``.

        Raises:
            LookupError: the ring is empty.
        """
        if not self._points:
            raise LookupError("the ring has no shards")
        at = bisect.bisect(self._points, stable_hash(key)) % len(self._points)
        return self._owners[at]


def _gevent_timeout() -> type[BaseException] | None:
    try:
        import gevent
    except ImportError:
        return None
    return gevent.Timeout


def is_retryable(exc: BaseException) -> bool:
    """True if another shard may answer what this one failed: a connection-level failure.

    * connection refused/reset, socket timeouts (``OSError``), a connection closed mid-response
      (``http.client.HTTPException``, which geventhttpclient's parse errors derive from), a
      gevent timeout (tritonclient.http's network timeout);
    * an ``InferenceServerException`` whose status is gRPC ``UNAVAILABLE`` or
      ``DEADLINE_EXCEEDED``, or HTTP 502/503/504, or that says the model is being unloaded
      on that server ("has no available versions": the server is shutting down).

    Everything else (HTTP 400, ``INVALID_ARGUMENT``, ``INTERNAL``, a client-side ``ValueError``)
    is the request's own problem and is not retried.
    """
    if isinstance(exc, InferenceServerException):
        status = exc.status()
        if status in RETRYABLE_GRPC or status in RETRYABLE_HTTP:
            return True
        return MODEL_UNLOADING in (exc.message() or "")
    if isinstance(exc, OSError | http.client.HTTPException):
        return True
    timeout = _gevent_timeout()
    return timeout is not None and isinstance(exc, timeout)


def _close_quietly(client) -> None:
    try:
        client.close()
    except Exception as exc:  # noqa: BLE001 - closing is best effort
        log.debug("closing a client failed: %s", exc)


@dataclass
class ShardStats:
    """Per-shard counters; every attempt counts once in ``requests``.

    Attributes:
        requests: attempts sent to this shard.
        answered: attempts it answered (successfully or with the request's own error).
        failures: attempts that failed at the connection level (each marked the shard down).
        retries: attempts it received for a key whose earlier shard had failed or was down.
    """

    requests: int = 0
    answered: int = 0
    failures: int = 0
    retries: int = 0


@dataclass
class _Shard:
    name: str
    url: str
    up: bool = True
    down_since: float | None = None
    stats: ShardStats = field(default_factory=ShardStats)


@dataclass(frozen=True)
class Routed:
    """One routed inference: the result, the shard that answered and the shards tried."""

    result: Any
    shard: str
    attempts: tuple[str, ...]


class AllShardsFailed(connection.ClientError):
    """Every shard tried for a request failed at the connection level."""


class Router:
    """Route inferences by key over several Triton servers (HTTP or gRPC); a context manager.

    Args:
        shards: shard name → ``host:port``. The ring hashes the *names*, so an HTTP and a gRPC
            router over the same names agree on owners, and a shard that comes back on another
            address keeps its keys.
        protocol: ``"http"`` or ``"grpc"``.
        vnodes: ring points per shard.
        max_attempts: distinct shards one request may try (default: all of them).
        request_timeout: seconds before an inference counts as failed (and is retried).
        health_interval: seconds between readiness probes of every shard by a background
            thread; ``None`` disables it (shards then go down only on failures and come back
            only through ``check()``).
        probe_timeout: seconds a readiness probe may take.
    """

    def __init__(
        self,
        shards: Mapping[str, str],
        protocol: str = "http",
        vnodes: int = DEFAULT_VNODES,
        max_attempts: int | None = None,
        request_timeout: float = 30.0,
        health_interval: float | None = 0.5,
        probe_timeout: float = 1.0,
    ):
        if not shards:
            raise ValueError("a router needs at least one shard")
        self.protocol = protocol
        self.mod = connection.module(protocol)
        self.ring = HashRing(shards, vnodes)
        self.max_attempts = max_attempts or len(shards)
        self.request_timeout = request_timeout
        self.probe_timeout = probe_timeout
        self._shards = {name: _Shard(name, url) for name, url in shards.items()}
        self._lock = threading.Lock()
        # tritonclient.http is not thread-safe (one gevent connection pool per client, bound to
        # the thread that made it), so HTTP clients are per thread; a gRPC channel is safe to
        # share, so gRPC clients are per shard.
        self._local = threading.local()
        self._grpc_clients: dict[str, Any] = {}
        self._all_clients: list[Any] = []
        self._stop = threading.Event()
        self._health: threading.Thread | None = None
        if health_interval is not None:
            self._health = threading.Thread(
                target=self._health_loop, args=(health_interval,), name="router-health", daemon=True
            )
            self._health.start()

    # Ring and state -----------------------------------------------------------------------
    def owner(self, key: str) -> str:
        """The shard that owns ``key`` on the ring, up or not."""
        return self.ring.owner(key)

    def route_order(self, key: str) -> list[str]:
        """Shards a request for ``key`` would try: live ones in ring order, then down ones.

        Down shards stay at the end as a last resort, so that a request still has somewhere
        to go when the health view is stale (every shard marked down).
        """
        walk = self.ring.walk(key)
        with self._lock:
            live = [s for s in walk if self._shards[s].up]
        return (live + [s for s in walk if s not in live])[: self.max_attempts]

    def is_up(self, shard: str) -> bool:
        """The router's current view of ``shard``."""
        with self._lock:
            return self._shards[shard].up

    def live_shards(self) -> list[str]:
        """Shards currently taken as up."""
        with self._lock:
            return [s.name for s in self._shards.values() if s.up]

    def stats(self) -> dict[str, ShardStats]:
        """A snapshot of every shard's counters."""
        with self._lock:
            return {n: ShardStats(**vars(s.stats)) for n, s in self._shards.items()}

    def _mark(self, shard: str, up: bool, reason: str = "") -> None:
        with self._lock:
            state = self._shards[shard]
            if state.up == up:
                return
            state.up = up
            state.down_since = None if up else time.monotonic()
        if up:
            log.info("shard %s is ready again: back in rotation", shard)
        else:
            log.warning("shard %s marked down: %s", shard, reason)

    # Clients ------------------------------------------------------------------------------
    def _client(self, shard: str):
        with self._lock:
            url = self._shards[shard].url
        if self.protocol == "grpc":
            with self._lock:
                client = self._grpc_clients.get(shard)
                if client is None:
                    client = self.mod.InferenceServerClient(url)
                    self._grpc_clients[shard] = client
                    self._all_clients.append(client)
            return client
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        client = clients.get((shard, url))
        if client is None:
            client = self.mod.InferenceServerClient(
                url, connection_timeout=self.probe_timeout, network_timeout=self.request_timeout
            )
            clients[shard, url] = client
            with self._lock:
                self._all_clients.append(client)
        return client

    def _drop_client(self, shard: str) -> None:
        # A failed HTTP connection pool may hold dead sockets; start the next request fresh.
        # (gRPC channels reconnect by themselves.)
        clients = getattr(self._local, "clients", None)
        if clients:
            self._close_cached(clients, [k for k in clients if k[0] == shard])

    def _release_down_clients(self) -> None:
        # Triton's graceful shutdown (SIGTERM) waits until every HTTP connection is closed;
        # idle keep-alive connections to a shard we no longer use would hold it up for its
        # whole exit timeout. Each thread closes its own (a tritonclient.http client belongs
        # to the thread that made it).
        clients = getattr(self._local, "clients", None)
        if not clients:
            return
        with self._lock:
            down = [k for k in clients if not self._shards[k[0]].up]
        self._close_cached(clients, down)

    def _close_cached(self, clients: dict, keys: list) -> None:
        for key in keys:
            client = clients.pop(key)
            with self._lock:
                self._all_clients.remove(client)
            _close_quietly(client)

    # Health -------------------------------------------------------------------------------
    def check(self, shard: str) -> bool:
        """Probe ``shard``'s readiness now (short timeout) and update its state.

        Returns:
            True if it answered ready.
        """
        with self._lock:
            url = self._shards[shard].url
        try:
            if self.protocol == "grpc":
                client = self.mod.InferenceServerClient(url)
                try:
                    ready = client.is_server_ready(client_timeout=self.probe_timeout)
                finally:
                    client.close()
            else:
                client = self.mod.InferenceServerClient(
                    url, connection_timeout=self.probe_timeout, network_timeout=self.probe_timeout
                )
                try:
                    ready = client.is_server_ready()
                finally:
                    client.close()
        except Exception as exc:  # noqa: BLE001 - any failure to answer means not ready
            ready, reason = False, f"{type(exc).__name__}: {exc}"
        else:
            reason = "not ready (starting or shutting down)"
        self._mark(shard, ready, reason)
        return ready

    def _health_loop(self, interval: float) -> None:
        # Also probes shards that are up: a server that is shutting down (SIGTERM) still
        # answers inferences but reports not ready, and routing away from it lets it drain.
        while not self._stop.wait(interval):
            for shard in list(self._shards):
                if self._stop.is_set():
                    return
                self.check(shard)

    # Inference ----------------------------------------------------------------------------
    def route(self, key: str, model: str, inputs, outputs=None, **kwargs) -> Routed:
        """Infer on ``key``'s shard, failing over along the ring walk.

        Args:
            key: the routing key (e.g. a user id).
            model: model name.
            inputs: InferInputs made with ``self.mod``.
            outputs: InferRequestedOutputs made with ``self.mod``.
            **kwargs: passed to tritonclient's ``infer`` (``headers``, ``parameters``...).

        Returns:
            The result, the shard that answered and every shard tried.

        Raises:
            InferenceServerException: a non-retryable error (a bad request), from the first
                shard that reported it; other shards are not tried.
            AllShardsFailed: every shard tried failed at the connection level.
        """
        attempts: list[str] = []
        last: BaseException | None = None
        if self.protocol == "grpc":
            kwargs.setdefault("client_timeout", self.request_timeout)
        else:
            self._release_down_clients()
        for shard in self.route_order(key):
            with self._lock:
                stats = self._shards[shard].stats
                stats.requests += 1
                stats.retries += bool(attempts)
            attempts.append(shard)
            try:
                result = self._client(shard).infer(model, inputs, outputs=outputs, **kwargs)
            except BaseException as exc:
                if not is_retryable(exc):
                    # Answered only if the server said no (the request's own error); a
                    # KeyboardInterrupt or a client-side error never reached an answer.
                    if isinstance(exc, InferenceServerException):
                        with self._lock:
                            stats.answered += 1
                    raise
                with self._lock:
                    stats.failures += 1
                self._drop_client(shard)
                self._mark(shard, False, f"{type(exc).__name__}: {exc}")
                last = exc
                continue
            with self._lock:
                stats.answered += 1
            return Routed(result, shard, tuple(attempts))
        raise AllShardsFailed(
            f"key {key!r}: every shard tried failed ({', '.join(attempts)}); last error: {last}"
        ) from last

    def infer(self, key: str, model: str, inputs, outputs=None, **kwargs):
        """Like ``route()``, returning only tritonclient's InferResult."""
        return self.route(key, model, inputs, outputs, **kwargs).result

    def close(self) -> None:
        """Stop the health checker and close every client this router made."""
        self._stop.set()
        if self._health is not None:
            self._health.join(timeout=10)
        with self._lock:
            clients, self._all_clients = self._all_clients, []
            self._grpc_clients.clear()
        for client in clients:
            _close_quietly(client)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
