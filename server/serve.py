"""Serve model_repository/ with tritonserver in the foreground; Ctrl-C stops it cleanly.

``main`` is ``python -m server`` (``make serve``); ``python -m gateway serve`` runs the same with
the gateway in front. Example:
    python -m server                       # loopback, ports 8000/8001/8002
    python -m server --host 0.0.0.0 --http-port 9000
    TRITON_ADMIN_KEY=... python -m server  # admin endpoints open to that key

Model control, the repository index, shared-memory registration and the log and trace settings
answer only requests with the header ``admin-key: <key>`` (gRPC metadata
``triton-grpc-protocol-admin-key``); the key is $TRITON_ADMIN_KEY, or one made at start and
printed once. Inference, health, metadata, model configs and statistics stay open.

Models load under explicit model control (every one at start), so that a supervisor can reload
a model whose Python-backend stub died, which tritonserver 2.51 does not do (server/supervisor.py;
``--no-supervisor`` turns it off).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from paths import MODEL_REPOSITORY
from pipelines import text_cache
from processes.managed import ManagedProcess, StartInterruptedError, StopRequests
from server import redis
from server.launcher import (
    ADMIN_APIS,
    ADMIN_KEY_ENV,
    Server,
    ServerConfig,
    ServerStartError,
)
from server.supervisor import StubSupervisor, explicit_control


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the launcher."""
    p = argparse.ArgumentParser(
        prog="python -m server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--http-port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument(
        "--model-config-name",
        default="auto",
        help="configs/<name>.pbtxt to use; 'auto' picks local/gpu/default for this machine, "
        "'' forces config.pbtxt",
    )
    p.add_argument("--log-verbose", type=int, default=0)
    admin = p.add_mutually_exclusive_group()
    admin.add_argument(
        "--admin-key",
        help=f"key for the admin endpoints (default: ${ADMIN_KEY_ENV}, else a new one; "
        "prefer the variable: a flag shows in the process list)",
    )
    admin.add_argument(
        "--open-admin-apis",
        action="store_true",
        help=f"no key: leave {', '.join(ADMIN_APIS)} open to every client",
    )
    p.add_argument(
        "--no-supervisor",
        action="store_true",
        help="do not reload a model whose Python-backend stub died",
    )
    p.add_argument(
        "--redis",
        metavar="local|URL",
        help="the shared layer of the embedding step's per-text cache: 'local' starts "
        "redis-server on loopback with a password and bounded memory (make serve REDIS=1); a "
        "URL (redis://, rediss:// for TLS, with its password and db) uses a Redis that runs "
        f"elsewhere (prefer ${text_cache.URL_ENV}: a flag shows in the process list). Default: the "
        "step's in-process cache only",
    )
    p.add_argument("--timeout", type=float, default=180, help="seconds to wait for readiness")
    p.add_argument("extra", nargs="*", help="further tritonserver flags, after --")
    return p.parse_args(argv)


def _admin_line(server: Server, shown_key: str | None) -> str:
    if not server.config.restricted_apis:
        return "OPEN: model control, shared memory, logging and trace need no key"
    ((header, key),) = server.admin_headers("http").items()
    apis = ", ".join(server.config.restricted_apis)
    return (
        f"{apis} need header '{header}: {shown_key or key}' (gRPC: triton-grpc-protocol-{header})"
    )


# Seconds tritonserver may drain in-flight requests once asked to stop, then the time it has to
# unload its models before it is killed: a stop by signal ends within 15 s.
EXIT_TIMEOUT_S = 5
STOP_TIMEOUT_S = 12


# What may stand in front of the server (``python -m gateway serve``): made once the server is
# ready, started after it and stopped before it. Returns the process, and what gives its
# banner lines once it has started (its ports are known then).
Front = Callable[[Server], tuple[ManagedProcess, Callable[[], str]]]


def main(argv: list[str] | None = None, front: Front | None = None) -> int:
    """Start the server, print its endpoints, stream its log, stop on Ctrl-C or SIGTERM.

    A first SIGINT/SIGTERM stops the server (during start-up too); a second one while it stops
    kills it and its stubs at once. Either way nothing it started is left running.

    Args:
        argv: the command line (default ``sys.argv[1:]``).
        front: a process to run in front of the server, such as the gateway.
    """
    # First of all: a signal from now on is counted, never raised in the middle of something.
    stops = StopRequests().install()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    extra, supervise = args.extra, False
    if not args.no_supervisor:
        controlled = explicit_control(args.extra)
        if controlled is None:
            print("note: model-control mode is not explicit: no stub supervisor", flush=True)
        else:
            extra, supervise = controlled, True
    if not any(a.startswith("--exit-timeout-secs") for a in extra):
        extra = [f"--exit-timeout-secs={EXIT_TIMEOUT_S}", *extra]
    cache = None
    if args.redis == "local":
        try:
            cache = redis.RedisServer()
            cache.start(stop_requests=stops)
        except (FileNotFoundError, ServerStartError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except StartInterruptedError:
            return 130
    try:
        return _serve(args, extra, supervise, stops, front, cache)
    finally:
        if cache is not None:
            cache.stop(stop_requests=stops)


def _serve(
    args: argparse.Namespace,
    extra: list[str],
    supervise: bool,
    stops: StopRequests,
    front: Front | None,
    cache: redis.RedisServer | None,
) -> int:
    """Start tritonserver (and ``front``) with embed's shared cache at ``cache`` or the URL given.

    Returns the launcher's exit status; stops everything it started, whatever happens.
    """
    url = cache.url if cache is not None else args.redis or os.environ.get(text_cache.URL_ENV)
    config = ServerConfig(
        text_cache_url=url,
        model_repository=args.model_repository.resolve(),
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        model_config_name=args.model_config_name or None,
        log_verbose=args.log_verbose,
        extra_args=extra,
        admin_key=args.admin_key,
        restricted_apis=() if args.open_admin_apis else ADMIN_APIS,
    )
    # Printed once only when made here: a key the user chose is not echoed into logs.
    if args.admin_key:
        shown_key = "<--admin-key>"
    else:
        shown_key = f"${ADMIN_KEY_ENV}" if os.environ.get(ADMIN_KEY_ENV) else None
    try:
        server = Server(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        server.start(timeout=args.timeout, stop_requests=stops)
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except StartInterruptedError:
        print("interrupted during start-up; server stopped", file=sys.stderr)
        return 130
    supervisor = proxy = None
    early_exit = None  # the status of a stop before the banner (the front failed, a signal)
    try:
        if supervise and not stops.count:
            supervisor = StubSupervisor.of(server).start()
        lines = ""
        if front is not None and not stops.count:
            proxy, describe = front(server)
            proxy.start(stop_requests=stops)
            lines = describe()
        if not stops.count:
            print(
                _banner(server, supervisor, shown_key, lines + _cache_line(cache, url)), flush=True
            )
        exited = _follow_log(server, stops)
    except ServerStartError as exc:  # the front could not start
        print(f"error: {exc}", file=sys.stderr)
        exited, early_exit = False, 1
    except StartInterruptedError:
        print("interrupted during start-up; server stopped", file=sys.stderr)
        exited, early_exit = False, 130
    finally:
        # Reached on a signal, on the server's exit and on any error above: always stop.
        if proxy is not None:
            proxy.stop(stop_requests=stops)
        if supervisor:
            supervisor.stop(timeout=2)
        if server.running():
            print("stopping tritonserver ...", flush=True)
        code = server.stop(timeout=STOP_TIMEOUT_S, stop_requests=stops)
    if exited:
        print(f"tritonserver exited ({code})\n{server.log_tail()}")
        return 1
    if early_exit is not None:
        return early_exit
    print(f"stopped (exit status {code})")
    return 0


def _banner(
    server: Server, supervisor: StubSupervisor | None, shown_key: str | None, front: str = ""
) -> str:
    config = server.config
    return (
        f"tritonserver ready ({server.installation.binary}, "
        f"model config: {config.model_config_name or 'config.pbtxt'})\n"
        f"  HTTP     http://{server.http_url}/v2/models/{{classify,embed}}\n"
        f"  gRPC     {server.grpc_url}\n"
        f"  metrics  {server.metrics_url}\n"
        f"  admin    {_admin_line(server, shown_key)}\n"
        f"  stubs    {'a dead one gets its model reloaded' if supervisor else 'not supervised'}\n"
        f"  log      {server.log_path}\n"
        f"{front}"
        "Ctrl-C stops it."
    )


def _cache_line(cache: redis.RedisServer | None, url: str | None) -> str:
    """The banner's line about embed's per-text cache (a URL's password is not shown)."""
    if cache is not None:
        where = f"redis-server on {cache.host}:{cache.port} (started here; password set)"
    elif url:
        where = f"the Redis at {urlsplit(url).hostname}:{urlsplit(url).port or 6379}"
    else:
        return "  cache    embed per text: in-process only (--redis local|URL to share it)\n"
    return f"  cache    embed per text: in-process, then {where}\n"


def _follow_log(server: Server, stops: StopRequests) -> bool:
    """Print what the server logs (tail -f) until a stop is requested; True if it exited."""
    with open(server.log_path, errors="replace") as log_file:
        log_file.seek(0, 2)
        while not stops.count:
            sys.stdout.write(log_file.read())
            sys.stdout.flush()
            if not server.running():
                return True
            time.sleep(0.2)
    return False
