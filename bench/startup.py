"""How long a server of the whole repository takes to start and to stop, per launcher setting.

Each round starts the same server once per setting, interleaved so that a busy machine slows
every setting alike, and times ``start()`` (until ``/v2/health/ready``) and ``stop()`` (SIGTERM
until every process of the server is gone). The setting compared by default is Triton's
config auto-complete: with it on, the Python backend starts one more stub per model only to call
``auto_complete_config`` (docs/processes.md#start-up-time)::

    .venv/bin/python -m bench.startup --rounds 5
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from server import Server, ServerConfig
from server.process import stub_pids

SETTINGS = {"auto-complete off": False, "auto-complete on": True}


def measure(auto_complete: bool) -> tuple[float, float, int]:
    """(start s, stop s, stub processes) of one server of the whole repository."""
    config = ServerConfig(
        http_port=0, grpc_port=0, metrics_port=0, auto_complete_config=auto_complete
    )
    server = Server(config)
    began = time.monotonic()
    server.start()
    started = time.monotonic()
    try:
        stubs = len(stub_pids(server.process.pid))
    finally:
        server.stop()
    return started - began, time.monotonic() - started, stubs


def main(argv: list[str] | None = None) -> int:
    """Print start and stop times per setting: each round, then the medians."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m bench.startup --rounds 5",
    )
    parser.add_argument("--rounds", type=int, default=3, help="starts per setting")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for name, auto_complete in SETTINGS.items():
            start, stop, stubs = measure(auto_complete)
            times[name].append((start, stop))
            line = f"start {start:5.2f} s  stop {stop:5.2f} s  ({stubs} stubs)"
            print(f"round {r + 1} {name:18s} {line}")
    for name, pairs in times.items():
        start = statistics.median(p[0] for p in pairs)
        stop = statistics.median(p[1] for p in pairs)
        print(f"median  {name:18s} start {start:5.2f} s  stop {stop:5.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
