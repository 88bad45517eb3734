"""python -m containers: the CPU stack in containers (make up / make down).

    python -m containers up                 # engine, images, compose stack, every service healthy
    python -m containers images --from debian   # only the images, from Debian's packages
    python -m containers down               # the stack's containers, networks and volumes gone

It needs root or a running Docker daemon (docker/engine.sh), Debian's docker.io, docker-compose
and mmdebstrap where no registry is reachable, and the exported models (make models). The gateway
listens on this host's loopback; GATEWAY_ADDRESS publishes it on another of its addresses.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys

from containers import images, stack, tools


def main(argv: list[str] | None = None) -> int:
    """Run one of the commands above; 0 on success."""
    parser = argparse.ArgumentParser(
        prog="python -m containers",
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m containers up --from debian",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("images", "up"):
        p = sub.add_parser(name)
        p.add_argument(
            "--from",
            dest="source",
            choices=["auto", "registry", "debian"],
            default="auto",
            help="Hub images and python:3.11-slim, or stand-ins from Debian's packages "
            "(auto: the registry where the Python base can be pulled)",
        )
    sub.add_parser("down")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    if args.command == "down" and not tools.engine_answers():
        print("no Docker daemon answers: no stack to take down", file=sys.stderr)
        return 0
    started = tools.start_engine()
    print(started.stdout + started.stderr, end="", file=sys.stderr)
    if started.returncode != 0:
        return 1
    if args.command == "images":
        for name, value in images.build_all(args.source).items():
            print(f"{name}={value}")
        return 0
    variables = stack.state_environment(stack.STATE)
    if args.command == "down":
        stack.Stack(variables).down()
        return 0
    variables |= images.build_all(args.source)
    running = stack.Stack(variables)
    seconds = running.up()
    print(f"every service healthy {seconds:.0f} s after up:")
    for name, state in sorted(running.states().items()):
        print(f"  {name:45} {state}")
    print(where(running))
    return 0


def where(running: stack.Stack) -> str:
    """Where the gateway and Prometheus listen, as Docker published them."""
    gateway, prometheus = running.published("gateway"), running.published("prometheus")
    # One address each (IPv4 first where Docker lists [::] beside 0.0.0.0).
    http, grpc = gateway[8080][0], gateway[8081][0]
    prometheus_ip, prometheus_port = prometheus[9090][0]
    lines = [
        f"gateway  http://{http[0]}:{http[1]} (HTTP, OpenAI at /v1), {grpc[0]}:{grpc[1]} (gRPC)",
        f"         tenant keys in {stack.STATE / stack.LIMITS_FILE} (header X-Api-Key or a "
        "Bearer token)",
        f"prometheus  http://{prometheus_ip}:{prometheus_port}",
    ]
    if not ipaddress.ip_address(http[0]).is_loopback:
        # Tenants' keys travel with every request: in plain text beyond this host.
        lines.append(
            f"warning: the gateway speaks plain text on {http[0]}; beyond loopback give it TLS "
            "(docker/docker-compose.tls.yml)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
