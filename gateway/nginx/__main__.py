r"""``python -m gateway.nginx``: render the gateway's nginx config, or move a rollout's shares.

``render`` prints the config for the given servers; ``rollout`` moves the shares of a running
gateway's rollout (``gateway/nginx/rollout.py``).

    python -m gateway limits my-limits.toml   # the limits with a fresh key per tenant
    python -m gateway.nginx render --http triton-0:8000 --http triton-1:8000 \
        --grpc triton-0:8001 --grpc triton-1:8001 --host 0.0.0.0 \
        --limits my-limits.toml > nginx.conf
    python -m gateway.nginx render ... --canary-http triton-v2:8000 --canary-grpc triton-v2:8001 \
        --rollout embed=0 --shares-file /etc/nginx/rollout.json > nginx.conf
    python -m gateway.nginx rollout --shares-file /etc/nginx/rollout.json embed=5

The deployments (docker/docker-compose.yml, docker/kubernetes/gateway.yaml) render theirs so,
inside the image.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.nginx import config, options, rollout
from gateway.shaping import LIMITS, load_limits
from paths import REPO_ROOT


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line of ``python -m gateway.nginx``."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.nginx",
        description="Render the nginx config that shards HTTP and gRPC over tritonservers.",
        epilog="example: python -m gateway.nginx render --http triton-0:8000 --http triton-1:8000 "
        "--grpc triton-0:8001 --grpc triton-1:8001 --host 0.0.0.0 > nginx.conf",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="print the config to stdout")
    options.repeated(r, "--http", "a server's HTTP host:port", required=True)
    options.repeated(r, "--grpc", "a server's gRPC host:port", required=True)
    r.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    r.add_argument("--http-port", type=int, default=8000)
    r.add_argument("--grpc-port", type=int, default=8001)
    r.add_argument("--workers", default="auto", help="worker processes (default: one per core)")
    r.add_argument(
        "--conns-per-client",
        type=int,
        default=64,
        help="requests at once from one client address (default 64; HTTP/2 streams count)",
    )
    r.add_argument("--max-body", default="64m", help="client_max_body_size (default 64m)")
    r.add_argument("--user", help="the user directive, for nginx started as root")
    r.add_argument(
        "--limits",
        type=Path,
        help=f"token buckets per tenant and model (e.g. {LIMITS.relative_to(REPO_ROOT)}); "
        "default: no shaping",
    )
    r.add_argument(
        "--check", action="store_true", help="also run `nginx -t` on it (needs nginx here)"
    )
    r.add_argument(
        "--openai",
        action="store_true",
        help="serve OpenAI's embeddings API too (/v1/embeddings, /v1/models)",
    )
    r.add_argument(
        "--js-module",
        help="path of nginx's njs module where nginx runs (default: found here, e.g. "
        f"{config.JS_MODULES[0]}; the nginx image has {config.JS_MODULES[1]})",
    )
    r.add_argument(
        "--js-dir",
        default=str(config.SCRIPTS_DIR),
        help=f"the folder where nginx finds {' and '.join(config.SCRIPTS)} "
        "(default: this checkout's)",
    )
    options.repeated(
        r,
        "--operator",
        "a client address or CIDR block that may read model configs and statistics "
        "(perf_analyzer needs both; repeatable); default: nobody",
        config.operator_network,
        "ADDRESS",
    )
    r.add_argument(
        "--access-log",
        default=config.ACCESS_LOG,
        help="where nginx writes a JSON line per inference request, with --limits or a rollout "
        f"(default {config.ACCESS_LOG}, under nginx's prefix)",
    )
    options.add_tls(r)
    options.add_rollout(r)
    r.add_argument(
        "--shares-file",
        type=Path,
        help=f"a rollout's shares file ({rollout.SHARES_FILE}): written there, and read there by "
        "nginx, so give the path nginx will see",
    )
    m = sub.add_parser("rollout", help="move a rollout's shares on a running gateway")
    m.add_argument(
        "--shares-file", type=Path, required=True, help="the running gateway's shares file"
    )
    m.add_argument("shares", nargs="+", type=rollout.parse_share, metavar="MODEL=PERCENT")
    how = m.add_mutually_exclusive_group()
    how.add_argument("--sticky", action="store_true", default=None, help="per tenant from now")
    how.add_argument(
        "--per-request", dest="sticky", action="store_false", help="per request from now"
    )
    return parser.parse_args(argv)


def gateway(args: argparse.Namespace) -> config.Gateway:
    """The config's context from the command line (reads the limits file).

    Raises:
        ValueError: an option nginx cannot take (the message says which).
    """
    tls = options.tls_of(args)  # the first thing checked
    return config.Gateway(
        config.Upstreams(tuple(args.http), tuple(args.grpc)),
        config.Listen(args.http_port, args.grpc_port, args.host),
        config.Clients(
            max_body=args.max_body,
            conns_per_client=args.conns_per_client,
            operators=tuple(args.operator),
        ),
        config.Runtime(args.workers, args.user, args.js_module, args.js_dir, args.access_log),
        shaping=config.Shaping(load_limits(args.limits)) if args.limits else None,
        openai=config.OpenAI() if args.openai else None,
        tls=tls,
        rollout=options.rollout_of(args, args.shares_file),
    )


def move(args: argparse.Namespace) -> int:
    """``rollout``: move the shares, print what changed; 1 if they were refused."""
    try:
        before, after = rollout.move(args.shares_file, dict(args.shares), args.sticky)
    except (ValueError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 1
    was = dict(before.models)
    for model, percent in after.models:
        print(f"{model}: {was.get(model, 0):g}% -> {percent:g}% to the canary")
    print("per tenant" if after.sticky else "per request")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Print the config (``--check``: exit 1 if ``nginx -t`` refuses it), or move shares."""
    args = parse_args(argv)
    if args.command == "rollout":
        return move(args)
    try:
        context = gateway(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    text = config.render(context)
    if context.rollout is not None:
        if args.shares_file is None:
            print(f"a rollout needs --shares-file ({rollout.SHARES_FILE})", file=sys.stderr)
            return 2
        rollout.write(args.shares_file, context.rollout.shares)
    if args.check:
        try:
            config.check_config(text)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
