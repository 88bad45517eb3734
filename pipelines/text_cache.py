"""A per-text embedding cache: an in-process LRU first, then a Redis that every replica shares.

Triton's response cache keys a whole request: a request of eight texts of which seven were seen
before is a full miss, and two replicas never share an entry. This cache keys each text. For one
formed batch the embedding step asks it once: every text is looked up in the process's own LRU
(bounded in bytes), the misses in Redis with one MGET; only what is still missing is encoded,
and the new vectors go back to both layers, to Redis in one pipelined round trip with a TTL.

Redis is never on the critical path for more than its timeout: every call has a timeout of a few
milliseconds, and a circuit breaker stops calling a Redis that keeps failing (down, slow, full,
a wrong password) until it has rested; meanwhile the texts are simply encoded. Nothing here can
make a request fail. The timeout is a deadline on the whole call, which runs on a thread of its
own: redis-py's socket timeouts do not cover the name lookup before a connect, and a Redis cut
off its network makes that lookup hang for seconds (Docker's DNS asks the host's for a name it
no longer has).

Keys cannot serve a wrong vector: they hash the text's bytes together with everything that
changes its vector (``Keyspace``: model, version, the encoder file's sha256, the tokenizer's,
the maximum length, pooling and normalization; and whether the text may be cut at that
length), so no text is stored in clear and a new export starts a new keyspace. Values carry a
format version, the vector's length and the text's word pieces; one that does not decode is
counted and recomputed, never returned.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

FORMAT = 1  # of a stored value; another one is a miss
_HEADER = struct.Struct("<BHH")  # format, dimensions, word pieces
KEY_PREFIX = "emb:"


@dataclass(frozen=True)
class Keyspace:
    """Everything a vector depends on besides its text; its digest prefixes every key."""

    model: str
    version: str
    encoder_sha256: str
    tokenizer_sha256: str
    max_tokens: int
    pooling: str = "mean"
    normalization: str = "l2"
    runtime: str = "onnxruntime"  # what runs the encoder file (the same file, other numerics)

    def digest(self) -> bytes:
        """sha256 of the fields, in a fixed order."""
        fields = (self.model, self.version, self.encoder_sha256, self.tokenizer_sha256,
                  str(self.max_tokens), self.pooling, self.normalization, self.runtime)  # fmt: skip
        return hashlib.sha256("\0".join(fields).encode()).digest()

    def keys(self, texts: Sequence[str], truncate: Sequence[bool] | None = None) -> list[str]:
        """The Redis key of each text: the keyspace, the text's flag and its bytes, hashed.

        The flag says whether the text may be cut at ``max_tokens`` (default: no); with it in
        every key, a vector of a cut text never answers a text that may not be cut (which must
        be refused), nor the reverse.
        """
        base = hashlib.blake2b(self.digest(), digest_size=32)
        out = []
        for text, cut in zip(texts, truncate or [False] * len(texts), strict=True):
            h = base.copy()
            h.update(b"\x01" if cut else b"\x00")
            h.update(text.encode("utf-8"))
            out.append(KEY_PREFIX + h.hexdigest()[:40])
        return out


class CorruptEntryError(ValueError):
    """A stored value that is not a vector of this keyspace's shape."""


def pack(vector: np.ndarray, tokens: int) -> bytes:
    """A vector and its text's word pieces as stored: header, then little-endian float32."""
    return _HEADER.pack(FORMAT, len(vector), tokens) + np.asarray(vector, "<f4").tobytes()


def unpack(data: bytes, dims: int) -> tuple[np.ndarray, int]:
    """(vector, word pieces) of a stored value.

    Raises:
        CorruptEntryError: another format, another length, or values that are not finite.
    """
    if len(data) != _HEADER.size + 4 * dims:
        raise CorruptEntryError(f"{len(data)} bytes where {_HEADER.size + 4 * dims} were expected")
    version, stored_dims, tokens = _HEADER.unpack_from(data)
    if version != FORMAT or stored_dims != dims:
        raise CorruptEntryError(f"format {version} with {stored_dims} dimensions")
    vector = np.frombuffer(data, "<f4", offset=_HEADER.size)
    if not np.isfinite(vector).all():
        raise CorruptEntryError("values that are not finite")
    return vector, tokens


class LocalLayer:
    """An LRU of packed values in this process, bounded by their bytes (cachetools)."""

    def __init__(self, max_bytes: int):
        from cachetools import LRUCache

        self.entries = LRUCache(maxsize=max_bytes, getsizeof=len)

    def get(self, key: str) -> bytes | None:
        """The value, or None; a hit becomes the most recently used."""
        return self.entries.get(key)

    def put(self, key: str, value: bytes) -> None:
        """Store a value, evicting the least recently used ones beyond the bound."""
        if len(value) <= self.entries.maxsize:
            self.entries[key] = value


@dataclass
class Outcome:
    """What one lookup or store did: counted into metrics once per formed batch."""

    local_hits: int = 0  # texts (each occurrence) the process's LRU answered
    shared_hits: int = 0  # texts (each occurrence) Redis answered
    misses: int = 0  # distinct texts neither had: to be encoded
    corrupt: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # kind of failure → count
    redis_seconds: list[float] = field(default_factory=list)  # each round trip's duration

    def error(self, kind: str) -> None:
        """Count one failed Redis call of this kind."""
        self.errors[kind] = self.errors.get(kind, 0) + 1


def error_kind(exc: BaseException) -> str:
    """A short, fixed label for a failed Redis call (a metric label: few values)."""
    import pybreaker
    import redis

    if isinstance(exc, pybreaker.CircuitBreakerError):
        return "breaker_open"
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError):
        return "auth"
    if isinstance(exc, redis.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, redis.ConnectionError):
        return "connection"
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return "full"
    if isinstance(exc, redis.ResponseError) and str(exc).startswith("OOM"):
        return "full"
    return "other"


# Where the step finds the shared Redis: the launcher sets it (server/redis.py), the step
# reads it (pipelines/backend/text_model.py).
URL_ENV = "EMBED_TEXT_CACHE_URL"


@dataclass(frozen=True)
class SharedSettings:
    """The shared layer's settings: these defaults, or a config's ``text_cache_*`` parameters.

    A call answers within ``timeout_s`` or counts as a failure; ``breaker_failures`` failures in
    a row open the breaker for ``breaker_reset_s``; a stored vector lives ``ttl_s``.
    """

    ttl_s: int = 7 * 24 * 3600
    timeout_s: float = 0.005
    breaker_failures: int = 5
    breaker_reset_s: float = 10.0

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> SharedSettings:
        """From a model config's parameters; absent ones keep the defaults.

        ``text_cache_ttl_s``, ``text_cache_timeout_ms``, ``text_cache_breaker_failures`` and
        ``text_cache_breaker_reset_s``.
        """
        d = cls()
        return cls(
            ttl_s=int(params.get("text_cache_ttl_s", d.ttl_s)),
            timeout_s=float(params.get("text_cache_timeout_ms", d.timeout_s * 1000)) / 1000,
            breaker_failures=int(params.get("text_cache_breaker_failures", d.breaker_failures)),
            breaker_reset_s=float(params.get("text_cache_breaker_reset_s", d.breaker_reset_s)),
        )


class SharedLayer:
    """Redis: one MGET per lookup, one pipelined SET with a TTL per store, behind a breaker.

    Args:
        url: ``redis://[:password@]host:port/db`` or ``rediss://`` for TLS (redis-py's URL).
        ttl_s: how long a stored vector lives.
        timeout_s: the longest any call may take (name lookup and connecting included).
        breaker_failures: consecutive failed calls that open the breaker.
        breaker_reset_s: how long an open breaker stays open before one call is tried again.
    """

    def __init__(
        self,
        url: str,
        ttl_s: int = SharedSettings.ttl_s,
        timeout_s: float = SharedSettings.timeout_s,
        breaker_failures: int = SharedSettings.breaker_failures,
        breaker_reset_s: float = SharedSettings.breaker_reset_s,
    ):
        import pybreaker
        import redis

        self.ttl_s = ttl_s
        # No retries: a call either answers within its timeout or counts as one failure.
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            retry=None,
        )
        self.breaker = pybreaker.CircuitBreaker(
            fail_max=breaker_failures, reset_timeout=breaker_reset_s
        )
        self.timeout_s = timeout_s
        # One call at a time (a stub executes one batch at a time anyway); a call still running
        # past its deadline keeps the next ones from queueing behind it.
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="redis")
        self._running: concurrent.futures.Future | None = None

    @property
    def open(self) -> bool:
        """True while the breaker keeps calls from reaching Redis."""
        return self.breaker.current_state == "open"

    def _call(self, outcome: Outcome, fn, *args):
        started = time.perf_counter()
        try:
            return self.breaker.call(self._within_deadline, fn, *args)
        except Exception as exc:  # noqa: BLE001 - every failure is a miss, counted by kind
            outcome.error(error_kind(exc))
            return None
        finally:
            outcome.redis_seconds.append(time.perf_counter() - started)

    def _within_deadline(self, fn, *args):
        # fn runs on the worker; the breaker (whose lock is held through a call) wraps only
        # this wait, so it never waits for a call stuck past its deadline.
        if self._running is not None and not self._running.done():
            raise TimeoutError("the previous Redis call is still running past its deadline")
        self._running = self._worker.submit(fn, *args)
        try:
            # The socket timeouts end a call on their own: a margin before giving up on it.
            return self._running.result(timeout=2 * self.timeout_s + 0.005)
        except concurrent.futures.TimeoutError:
            raise TimeoutError("Redis call past its deadline") from None

    def get_many(self, keys: list[str], outcome: Outcome) -> list[bytes | None]:
        """Values of ``keys`` in order (None for a miss), or all None if Redis failed."""
        found = self._call(outcome, self.client.mget, keys)
        return list(found) if found is not None else [None] * len(keys)

    def put_many(self, values: dict[str, bytes], outcome: Outcome) -> None:
        """Store values with the TTL in one round trip; a failure is counted, nothing else."""

        def store() -> None:
            pipe = self.client.pipeline(transaction=False)
            for key, value in values.items():
                pipe.set(key, value, ex=self.ttl_s)
            pipe.execute()

        self._call(outcome, store)


class TextCache:
    """The two layers in front of an encoder: ``lookup`` before it, ``store`` after it."""

    def __init__(self, keyspace: Keyspace, dims: int, local: LocalLayer | None,
                 shared: SharedLayer | None = None):  # fmt: skip
        self.keyspace = keyspace
        self.dims = dims
        self.local = local
        self.shared = shared

    def lookup(
        self, texts: Sequence[str], truncate: Sequence[bool] | None = None
    ) -> tuple[list[tuple[np.ndarray, int] | None], Outcome]:
        """(vector, word pieces) or None for each text, in order; what each layer answered.

        ``truncate``: whether each text may be cut (default: none may), part of its key.
        """
        outcome = Outcome()
        keys = self.keyspace.keys(texts, truncate)
        found: list[tuple[np.ndarray, int] | None] = [None] * len(texts)
        missing: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            found[i] = self._decoded(self.local.get(key) if self.local else None, outcome)
            if found[i] is None:
                missing.setdefault(key, []).append(i)
            else:
                outcome.local_hits += 1
        if missing and self.shared is not None:
            # An open breaker answers at once, without Redis (counted as "breaker_open").
            asked = list(missing)
            for key, value in zip(asked, self.shared.get_many(asked, outcome), strict=True):
                entry = self._decoded(value, outcome)
                if entry is None:
                    continue
                if self.local is not None:
                    self.local.put(key, value)
                for i in missing.pop(key):
                    found[i] = entry
                    outcome.shared_hits += 1
        outcome.misses = len(missing)  # distinct texts: each is encoded once
        return found, outcome

    def store(
        self,
        texts: Sequence[str],
        vectors: Sequence[np.ndarray],
        tokens: Sequence[int],
        truncate: Sequence[bool] | None = None,
    ) -> Outcome:
        """Keep newly encoded vectors in both layers (Redis: one round trip, with the TTL)."""
        outcome = Outcome()
        keys = self.keyspace.keys(texts, truncate)
        values = {key: pack(v, n) for key, v, n in zip(keys, vectors, tokens, strict=True)}
        if self.local is not None:
            for key, value in values.items():
                self.local.put(key, value)
        if values and self.shared is not None:
            self.shared.put_many(values, outcome)
        return outcome

    def _decoded(self, value: bytes | None, outcome: Outcome) -> tuple[np.ndarray, int] | None:
        if value is None:
            return None
        try:
            return unpack(value, self.dims)
        except CorruptEntryError:
            outcome.corrupt += 1
            return None
