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
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from paths import MODEL_REPOSITORY
from pipelines import text_cache
from processes.managed import ManagedProcess, StartInterruptedError, StopRequests
from server import redis, tracing
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
    traced = p.add_argument_group(
        "tracing",
        "OpenTelemetry traces of the server and its Python steps, off by default "
        "(docs/operations.md#tracing-one-request)",
    )
    traced.add_argument(
        "--trace-url",
        metavar="URL",
        help="an OTLP/HTTP endpoint (a collector's, or `python -m monitoring.traces` at "
        "http://127.0.0.1:4318/v1/traces): turns tracing on",
    )
    traced.add_argument(
        "--trace-rate",
        type=int,
        default=tracing.DEFAULT_RATE,
        help="trace one request in N (default: %(default)s, Triton's)",
    )
    traced.add_argument(
        "--trace-resource",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a resource attribute of the spans, e.g. service.version=1.2 (repeatable)",
    )
    p.add_argument("--timeout", type=float, default=180, help="seconds to wait for readiness")
    p.add_argument("extra", nargs="*", help="further tritonserver flags, after --")
    args = p.parse_args(argv)
    args.trace = None
    if args.trace_url:
        try:
            resource = tracing.parse_resource(args.trace_resource)
            args.trace = tracing.TraceSettings(args.trace_url, args.trace_rate, resource)
        except ValueError as exc:
            p.error(str(exc))
    return args


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


class _EarlyExitError(Exception):
    """The launcher ends with ``status`` before serving; why has been printed already."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


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
    extra, supervise = _tritonserver_flags(args)
    # Caught outside the stack: what it stops learns that the run ended early.
    try:
        with contextlib.ExitStack() as stack:
            return _serve(stack, args, extra, supervise, stops, front)
    except _EarlyExitError as early:
        return early.status


def _tritonserver_flags(args: argparse.Namespace) -> tuple[list[str], bool]:
    """The further flags of tritonserver, and whether a supervisor reloads a model whose stub died.

    The supervisor needs explicit model control: the flags get it unless they chose another
    mode (then there is no supervisor).
    """
    extra, supervise = args.extra, False
    if not args.no_supervisor:
        controlled = explicit_control(args.extra)
        if controlled is None:
            print("note: model-control mode is not explicit: no stub supervisor", flush=True)
        else:
            extra, supervise = controlled, True
    if not any(a.startswith("--exit-timeout-secs") for a in extra):
        extra = [f"--exit-timeout-secs={EXIT_TIMEOUT_S}", *extra]
    return extra, supervise


def _serve(
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
    extra: list[str],
    supervise: bool,
    stops: StopRequests,
    front: Front | None,
) -> int:
    """Start each part, its stop pushed on ``stack``; then follow the log until a stop.

    The parts start in this order, and ``stack`` stops them in reverse: redis-server
    (``--redis local``), tritonserver, the stub supervisor, ``front``. Once a signal has been
    counted, the parts not yet started and the banner are skipped.

    Returns:
        1 if tritonserver exited by itself, 0 if it was stopped.

    Raises:
        _EarlyExitError: a part could not start, or a signal stopped its start.
    """
    cache = _start_redis(stack, stops) if args.redis == "local" else None
    url = cache.url if cache is not None else args.redis or os.environ.get(text_cache.URL_ENV)
    foreground = _start_server(stack, _server_config(args, extra, url), args.timeout, stops)
    server = foreground.server
    supervisor = None
    if supervise and not stops.count:
        supervisor = StubSupervisor.of(server).start()
        stack.callback(supervisor.stop, timeout=2)
    lines = ""
    if front is not None and not stops.count:
        proxy, describe = front(server)
        with _exit_if_start_fails():
            proxy.start(stop_requests=stops)
        stack.callback(proxy.stop, stop_requests=stops)
        lines = describe()
    if not stops.count:
        lines += _cache_line(cache, url) + _trace_line(args.trace)
        banner = _banner(server, supervisor, _shown_key(args), lines)
        print(banner, flush=True)
    foreground.exited = _follow_log(server, stops)
    return 1 if foreground.exited else 0


def _start_redis(stack: contextlib.ExitStack, stops: StopRequests) -> redis.RedisServer:
    """redis-server for embed's shared cache, stopped last of all."""
    try:
        cache = redis.RedisServer()
        cache.start(stop_requests=stops)
    except (FileNotFoundError, ServerStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise _EarlyExitError(1) from exc
    except StartInterruptedError as exc:
        raise _EarlyExitError(130) from exc
    stack.callback(cache.stop, stop_requests=stops)
    return cache


def _start_server(
    stack: contextlib.ExitStack, config: ServerConfig, timeout: float, stops: StopRequests
) -> _Foreground:
    """tritonserver, ready within ``timeout`` seconds; the stack stops it and says how it ended."""
    try:
        server = Server(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise _EarlyExitError(2) from exc
    with _exit_if_start_fails():
        server.start(timeout=timeout, stop_requests=stops)
    return stack.enter_context(_Foreground(server, stops))


@contextlib.contextmanager
def _exit_if_start_fails() -> Iterator[None]:
    """A failed start ends the launcher: 1 with the error, 130 after a signal.

    The process that failed has stopped already (``ManagedProcess.start`` does it).
    """
    try:
        yield
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise _EarlyExitError(1) from exc
    except StartInterruptedError as exc:
        print("interrupted during start-up; server stopped", file=sys.stderr)
        raise _EarlyExitError(130) from exc


class _Foreground:
    """A started tritonserver: on leaving, it is stopped and a line says how it ended."""

    def __init__(self, server: Server, stops: StopRequests):
        self.server = server
        self.stops = stops
        self.exited = False  # it exited by itself, rather than being stopped

    def __enter__(self) -> _Foreground:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Reached on a signal, on the server's exit and on any error: always stop.
        if self.server.running():
            print("stopping tritonserver ...", flush=True)
        code = self.server.stop(timeout=STOP_TIMEOUT_S, stop_requests=self.stops)
        if self.exited:
            print(f"tritonserver exited ({code})\n{self.server.log_tail()}")
        elif exc_type is None:  # an early exit has said why already
            print(f"stopped (exit status {code})")


def _server_config(
    args: argparse.Namespace, extra: list[str], text_cache_url: str | None
) -> ServerConfig:
    """What tritonserver runs with: the command line, and where embed's shared cache is."""
    return ServerConfig(
        text_cache_url=text_cache_url,
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
        trace=args.trace,
    )


def _shown_key(args: argparse.Namespace) -> str | None:
    """How the banner names the admin key; None: it was made here, and is printed once.

    A key the user chose is not echoed into logs.
    """
    if args.admin_key:
        return "<--admin-key>"
    return f"${ADMIN_KEY_ENV}" if os.environ.get(ADMIN_KEY_ENV) else None


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


def _trace_line(trace: tracing.TraceSettings | None) -> str:
    """The banner's line about OpenTelemetry traces."""
    if trace is None:
        return "  trace    off (--trace-url URL)\n"
    return f"  trace    1 request in {trace.rate} → {trace.url}\n"


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
