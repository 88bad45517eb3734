"""nginx in front of several tritonservers: the config and a managed nginx process.

The config comes from ``docker/nginx/nginx.conf.template``: an HTTP upstream over the servers'
HTTP ports and a gRPC upstream (HTTP/2 cleartext, ``grpc_pass grpc://``) over their gRPC ports,
both hashed by the ``X-User-Id`` header with consistent hashing, retried on the next server
when one fails. ``Nginx`` runs Debian's nginx as the current user from a temp prefix (pid,
temp files and config there, nothing under /etc or /var), for the tests and for local use.

Render a config for N containers:
    python -m server.nginx render --http triton-0:8000 --http triton-1:8000 \
        --grpc triton-0:8001 --grpc triton-1:8001 --host 0.0.0.0 > nginx.conf
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from server.launcher import REPO_ROOT, free_port
from server.process import ManagedProcess, client_host

__all__ = ["TEMPLATE", "Nginx", "find_nginx", "render"]

TEMPLATE = REPO_ROOT / "docker" / "nginx" / "nginx.conf.template"
INSTALL_HINT = (
    "apt-get install -y --no-install-recommends nginx (Debian 12's nginx 1.22; `make tools`), "
    "or set $NGINX to an nginx binary"
)
USER_ID_HEADER = "X-User-Id"


def find_nginx() -> str:
    """Path of the nginx binary: ``$NGINX``, PATH, then Debian's ``/usr/sbin/nginx``.

    Raises:
        FileNotFoundError: no nginx; the message says how to install it.
    """
    for candidate in (os.environ.get("NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).exists():
            return candidate
    raise FileNotFoundError(f"nginx not found: {INSTALL_HINT}")


def _servers(addresses: Sequence[str], max_fails: int, fail_timeout: str) -> str:
    if not addresses:
        raise ValueError("an upstream needs at least one server")
    return "\n".join(
        f"        server {a} max_fails={max_fails} fail_timeout={fail_timeout};" for a in addresses
    )


def render(
    http_upstreams: Sequence[str],
    grpc_upstreams: Sequence[str],
    http_port: int,
    grpc_port: int,
    host: str = "127.0.0.1",
    workers: int = 1,
    max_body: str = "64m",
    max_fails: int = 1,
    fail_timeout: str = "2s",
    user: str | None = None,
    template: Path = TEMPLATE,
) -> str:
    """The nginx config for these upstreams (``host:port`` each) and listen ports.

    Args:
        http_upstreams: the servers' HTTP endpoints.
        grpc_upstreams: the servers' gRPC endpoints.
        http_port: where nginx listens for HTTP (``/v2/...`` is proxied as is).
        grpc_port: where nginx listens for gRPC (HTTP/2 cleartext).
        host: listen address.
        workers: nginx worker processes.
        max_body: ``client_max_body_size``.
        max_fails: failures that take a server out of rotation for ``fail_timeout``.
        fail_timeout: how long a failed server stays out before nginx tries it again.
        user: the ``user`` directive (only meaningful when nginx starts as root).
        template: the template file.

    Returns:
        The config text.
    """
    fields = {
        "@USER@": f"user {user};" if user else "",
        "@WORKERS@": str(workers),
        "@MAX_BODY@": max_body,
        "@HTTP_SERVERS@": _servers(http_upstreams, max_fails, fail_timeout),
        "@GRPC_SERVERS@": _servers(grpc_upstreams, max_fails, fail_timeout),
        "@HOST@": host,
        "@HTTP_PORT@": str(http_port),
        "@GRPC_PORT@": str(grpc_port),
        # Every server once at most: more tries would only come back to a failed one.
        "@TRIES@": str(max(len(http_upstreams), len(grpc_upstreams))),
    }
    text = template.read_text()
    for name, value in fields.items():
        text = text.replace(name, value)
    return text


class Nginx(ManagedProcess):
    """nginx in front of tritonservers, run from a temp prefix; a context manager.

    Ports of 0 are replaced by free ones at start.
    """

    name = "nginx"

    def __init__(
        self,
        http_upstreams: Sequence[str],
        grpc_upstreams: Sequence[str],
        http_port: int = 0,
        grpc_port: int = 0,
        host: str = "127.0.0.1",
        workers: int = 1,
        log_path: Path | None = None,
    ):
        super().__init__(log_path)
        self.binary = find_nginx()
        self.http_upstreams = list(http_upstreams)
        self.grpc_upstreams = list(grpc_upstreams)
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.host = host
        self.workers = workers
        self.prefix: Path | None = None

    @property
    def http_url(self) -> str:
        """host:port of nginx's HTTP listener (what tritonclient.http expects)."""
        return f"{client_host(self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """host:port of nginx's gRPC listener."""
        return f"{client_host(self.host)}:{self.grpc_port}"

    @property
    def ready_url(self) -> str:
        """The URL of nginx's own readiness location (not the upstreams')."""
        return f"http://{self.http_url}/nginx-ready"

    @property
    def config_path(self) -> Path:
        """The rendered config (inside the prefix)."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / "nginx.conf"

    def prepare(self) -> None:
        """Pick free ports, make the prefix and write the rendered config there."""
        if self.http_port == 0:
            self.http_port = free_port(client_host(self.host))
        if self.grpc_port == 0:
            self.grpc_port = free_port(client_host(self.host))
        self.prefix = Path(tempfile.mkdtemp(prefix="nginx-"))
        (self.prefix / "tmp").mkdir()
        # Started as root, nginx runs its workers as `nobody`, who cannot enter the 0700 temp
        # prefix; keep them as the user we are.
        user = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() == 0 else None
        self.config_path.write_text(
            render(
                self.http_upstreams,
                self.grpc_upstreams,
                self.http_port,
                self.grpc_port,
                host=self.host,
                workers=self.workers,
                user=user,
            )
        )

    def command(self) -> list[str]:
        """``nginx -p PREFIX -c CONF -e stderr -g 'daemon off;'`` (in the foreground)."""
        return [
            self.binary,
            "-p",
            f"{self.prefix}/",
            "-c",
            str(self.config_path),
            # The error log before the config is read: the default may be an unwritable file.
            "-e",
            "stderr",
            "-g",
            "daemon off;",
        ]

    def stop(self, timeout: float = 10.0, stop_requests=None) -> int | None:
        """Stop nginx (SIGTERM is its fast shutdown); the prefix goes with it."""
        return super().stop(timeout, stop_requests)

    def cleanup(self) -> None:
        """Remove the prefix (config, temp files)."""
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m server.nginx render``: print a config for the given servers."""
    parser = argparse.ArgumentParser(
        prog="python -m server.nginx",
        description="Render the nginx config that shards HTTP and gRPC over tritonservers.",
        epilog="example: python -m server.nginx render --http triton-0:8000 --http triton-1:8000 "
        "--grpc triton-0:8001 --grpc triton-1:8001 --host 0.0.0.0 > nginx.conf",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="print the config to stdout")
    r.add_argument("--http", action="append", required=True, help="a server's HTTP host:port")
    r.add_argument("--grpc", action="append", required=True, help="a server's gRPC host:port")
    r.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    r.add_argument("--http-port", type=int, default=8000)
    r.add_argument("--grpc-port", type=int, default=8001)
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("--max-body", default="64m", help="client_max_body_size (default 64m)")
    r.add_argument("--user", help="the user directive, for nginx started as root")
    args = parser.parse_args(argv)
    sys.stdout.write(
        render(
            args.http,
            args.grpc,
            args.http_port,
            args.grpc_port,
            host=args.host,
            workers=args.workers,
            max_body=args.max_body,
            user=args.user,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
