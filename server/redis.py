"""A local redis-server for the embedding step's shared per-text cache, started as users run it.

``python -m server --redis local`` (``make serve REDIS=1``) starts Debian's ``redis-server``
beside tritonserver: bound to loopback, a password made at start, ``maxmemory`` with
``allkeys-lru`` (a full cache evicts the least recently used vectors instead of refusing new
ones) and no persistence (a cache, not a store). The stubs of tritonserver find it through
``EMBED_TEXT_CACHE_URL`` (``pipelines.text_cache.URL_ENV``); ``--redis URL`` points them at a
Redis that runs elsewhere instead (``rediss://`` for TLS, a password, a database number).
"""

from __future__ import annotations

import secrets
import shutil
import socket
from pathlib import Path
from urllib.parse import quote

from processes.managed import ManagedProcess

# How the embedding step's stubs learn where the shared cache is (tritonserver passes its
# environment to them).
DEFAULT_MAXMEMORY = "256mb"


def find_binary() -> str:
    """Path of ``redis-server`` (Debian's package: ``apt-get install redis-server``).

    Raises:
        FileNotFoundError: it is not installed.
    """
    found = shutil.which("redis-server")
    if not found:
        raise FileNotFoundError("redis-server not found: apt-get install redis-server")
    return found


class RedisServer(ManagedProcess):
    """redis-server on loopback with a password and bounded memory; a context manager.

    A port of 0 is replaced by a free one at start.
    """

    name = "redis-server"
    poll_interval = 0.05

    def __init__(
        self,
        port: int = 0,
        password: str | None = None,
        maxmemory: str = DEFAULT_MAXMEMORY,
        policy: str = "allkeys-lru",
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ):
        super().__init__(log_path)
        self.extra_args = list(extra_args)
        self.binary = find_binary()
        self.port = port
        self.password = password or secrets.token_urlsafe(24)
        self.maxmemory = maxmemory
        self.policy = policy
        self.host = host

    @property
    def url(self) -> str:
        """``redis://:<password>@host:port/0``: what the cache's clients are given."""
        return f"redis://:{quote(self.password, safe='')}@{self.host}:{self.port}/0"

    def prepare(self) -> None:
        """Pick a free port where asked."""
        self.port = self.port_or_free(self.port)

    def command(self) -> list[str]:
        """redis-server in the foreground, configured on the command line (no config file)."""
        return [
            self.binary,
            "--bind", self.host,
            "--port", str(self.port),
            "--requirepass", self.password,
            "--maxmemory", self.maxmemory,
            "--maxmemory-policy", self.policy,
            # A cache: nothing is written to disk, and a restart starts empty.
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", "",
            *self.extra_args,
        ]  # fmt: skip

    def is_ready(self, timeout_s: float = 2.0) -> bool:
        """True once it answers PING (after AUTH) on its port."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as conn:
                conn.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                reply = b""
                while reply.count(b"\r\n") < 2:
                    chunk = conn.recv(256)
                    if not chunk:
                        return False
                    reply += chunk
                return reply.endswith(b"+PONG\r\n")
        except OSError:
            return False
