"""``python -m gateway serve``: tritonserver with the gateway in front, in the foreground.

The launcher's server (``python -m server``: every other option after ``serve`` is its own) with
nginx in front of it: the served part of Triton's HTTP and gRPC APIs through the gateway, and
OpenAI's embeddings API (``POST /v1/embeddings``, ``GET /v1/models``) beside them. ``--host`` is
where the gateway listens; Triton listens on loopback only. ``make serve GATEWAY=1`` runs it.

``python -m gateway limits FILE`` writes a limits file to serve with: docker/nginx/limits.toml
with a fresh random key in place of each placeholder key (which a gateway refuses), readable by
its owner only. Hand each tenant its key (``keys = [...]`` in FILE).

Examples:
    python -m gateway serve                                 # gateway on 8080 (HTTP) and 8081 (gRPC)
    python -m gateway limits my-limits.toml                 # token buckets with keys of their own
    python -m gateway serve --host 0.0.0.0 --limits my-limits.toml   # for other machines
    python -m gateway serve --limits my-limits.toml --gateway-port 9000
    python -m gateway serve --canary-http 127.0.0.1:8100 --canary-grpc 127.0.0.1:8101 \
        --rollout embed=0                 # a new version on other servers; move its share later
    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 python my_rag_app.py

Needs nginx and its njs module (Debian: ``apt-get install nginx libnginx-mod-http-js``;
``make tools`` installs both).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from gateway.nginx import options
from gateway.nginx.config import (
    Gateway,
    Listen,
    OpenAI,
    Shaping,
    Upstreams,
    find_js_module,
    find_nginx,
)
from gateway.nginx.process import Nginx
from gateway.shaping import ANONYMOUS, LIMITS, load_limits, write_with_secret_keys
from paths import REPO_ROOT
from server import serve

DEFAULT_HTTP_PORT = 8080
DEFAULT_GRPC_PORT = 8081
LIMITS_SHOWN = LIMITS.relative_to(REPO_ROOT)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The gateway's own options, and the rest for the server's launcher."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="tritonserver with the gateway in front (other options: python -m server --help)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="the gateway's address (default: loopback only); Triton stays on loopback",
    )
    serve.add_argument("--gateway-port", type=int, default=DEFAULT_HTTP_PORT, help="HTTP")
    serve.add_argument("--gateway-grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="gRPC")
    serve.add_argument(
        "--limits",
        type=Path,
        help="token buckets per tenant and model, a file `python -m gateway limits` wrote; "
        "default: none",
    )
    options.add_tls(serve)
    options.add_rollout(serve)
    limits = sub.add_parser(
        "limits", help="write a limits file with a fresh key per tenant, to serve with"
    )
    limits.add_argument("out", type=Path, help="the file to write (never overwritten)")
    limits.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=LIMITS,
        help=f"the limits whose placeholder keys are replaced (default {LIMITS_SHOWN})",
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "limits" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args, rest


def main(argv: list[str] | None = None) -> int:
    """Serve until Ctrl-C: the server first, then the gateway; stopped in reverse order."""
    args, rest = parse_args(argv)
    if args.command == "limits":
        try:
            limits = write_with_secret_keys(args.source, args.out)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        tenants = ", ".join(t for t in limits.tenants if t != ANONYMOUS) or "no tenant"
        print(f"wrote {args.out}: a fresh key for {tenants} (keep the file secret)")
        return 0
    try:
        find_nginx()
        find_js_module()
        limits = load_limits(args.limits) if args.limits else None
        tls = options.tls_of(args, here=True)
        canary = options.rollout_of(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # --host is the gateway's: the launcher's stays at its default, loopback, so that clients
    # reach Triton through the gateway only.

    def front(server) -> tuple[Nginx, Callable[[], str]]:
        gateway = Gateway(
            Upstreams.of(server),
            Listen(args.gateway_port, args.gateway_grpc_port, args.host),
            shaping=Shaping(limits) if limits else None,
            openai=OpenAI.of_repository(server.config.model_repository),
            tls=tls,
            rollout=canary,
        )
        nginx = Nginx(gateway)
        return nginx, lambda: banner(nginx, args.limits)

    return serve.main(rest, front=front)


def banner(nginx: Nginx, limits: Path | None) -> str:
    """The gateway's lines of the launcher's banner."""
    shaping = f"token buckets of {limits}" if limits else "no token buckets"
    scheme, grpc = ("http", "gRPC") if nginx.gateway.tls is None else ("https", "gRPC over TLS")
    lines = (
        f"  OpenAI   {scheme}://{nginx.http_url}/v1 "
        f"(embeddings: {', '.join(m for m, _ in nginx.gateway.openai.models)})\n"
        f"  gateway  {scheme}://{nginx.http_url}/v2, {grpc} {nginx.grpc_url} ({shaping})\n"
    )
    if nginx.gateway.rollout is not None:
        shares = ", ".join(f"{m} {p:g}%" for m, p in nginx.gateway.rollout.shares.models)
        lines += (
            f"  rollout  to {', '.join(nginx.gateway.rollout.http)}: {shares or 'no model yet'}; "
            f"move: python -m gateway.nginx rollout --shares-file {nginx.shares_file} "
            "MODEL=PERCENT\n"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
