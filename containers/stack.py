"""The compose stack of docker/ on a CPU host: up until healthy, its containers, down.

One ``Stack`` is one Compose project: docker-compose.yml with the CPU override, the images
``containers.images`` chose, and the stack's secrets (Redis and Grafana passwords, tenant keys)
from a state folder of its own. ``make up`` keeps that folder in ``.containers/``, so that
the keys stay the same from one ``up`` to the next; tests give each stack a fresh one.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from containers import tools
from gateway import shaping
from paths import REPO_ROOT

log = logging.getLogger(__name__)

DOCKER = tools.DOCKER
COMPOSE_FILES = (DOCKER / "docker-compose.yml", DOCKER / "docker-compose.cpu.yml")
PROJECT = "triton-model-repository"
STATE = REPO_ROOT / ".containers"
# Services that run once and exit (compose's service_completed_successfully).
ONE_SHOT = {"gateway-config"}
# A service that reads, once at its start, what a one-shot service writes at every `up`: nginx
# and the config gateway-config renders. An `up` that renders anew restarts the reader.
READS_RENDERED = {"gateway": "gateway-config"}


def state_environment(folder: Path) -> dict[str, str]:
    """The stack's secrets, made once in ``folder`` and read back after.

    ``folder/env`` holds REDIS_PASSWORD, GRAFANA_ADMIN_PASSWORD and GATEWAY_LIMITS (the limits
    file beside it, with keys of its own); nothing of it is committed.
    """
    env_file = folder / "env"
    if not env_file.exists():
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        (folder / "limits.toml").write_text(shaping.with_secret_keys(shaping.LIMITS.read_text()))
        env_file.write_text(
            f"REDIS_PASSWORD={secrets.token_hex(16)}\n"
            f"GRAFANA_ADMIN_PASSWORD={secrets.token_hex(16)}\n"
            f"GATEWAY_LIMITS={(folder / 'limits.toml').resolve()}\n"
        )
    pairs = (line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return dict(pairs)


def _instant(stamp: str) -> datetime.datetime:
    """Docker's RFC 3339 time with nanoseconds, to the microsecond Python reads."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}")


@dataclass
class Stack:
    """One Compose project of docker-compose.yml + docker-compose.cpu.yml."""

    variables: dict[str, str]  # compose variables: images, ports, secrets
    project: str = PROJECT
    files: tuple[Path, ...] = COMPOSE_FILES
    profiles: list[str] = field(default_factory=list)
    compose_command: list[str] | None = None  # default: tools.compose()

    def command(self, *args: str) -> list[str]:
        """Compose's command line for this project."""
        files = [arg for path in self.files for arg in ("-f", str(path))]
        profiles = [arg for name in self.profiles for arg in ("--profile", name)]
        compose = self.compose_command or tools.compose()
        return [*compose, "-p", self.project, *files, *profiles, *args]

    def environment(self) -> dict[str, str]:
        """What Compose interpolates: this process's environment and the stack's variables."""
        return {**os.environ, **self.variables}

    def compose(self, *args: str, timeout: float = 300, check: bool = True):
        """Run Compose; its CompletedProcess (raises on failure when ``check``)."""
        done = subprocess.run(
            self.command(*args),
            env=self.environment(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(self.command(*args))}:\n{done.stderr[-4000:]}")
        return done

    def up(self, *args: str, timeout_s: float = 240) -> float:
        """``up -d`` (images already built), then wait until every service is healthy.

        Returns:
            Seconds from ``up`` to every service healthy.
        """
        started = time.monotonic()
        self.compose("up", "-d", "--no-build", *args, timeout=timeout_s)
        self.wait_healthy(timeout_s - (time.monotonic() - started))
        for reader, writer in READS_RENDERED.items():
            begun = _instant(self.container(reader)["State"]["StartedAt"])
            if begun < _instant(self.container(writer)["State"]["FinishedAt"]):
                log.info("%s started before %s wrote its config: restarting it", reader, writer)
                self.compose("restart", reader)
                self.wait_healthy(timeout_s - (time.monotonic() - started))
        return time.monotonic() - started

    def down(self) -> None:
        """Stop and remove the project's containers, networks and volumes."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=180)

    def containers(self, all_: bool = True) -> list[dict]:
        """``docker inspect`` of each container of this project (stopped ones too)."""
        ids = subprocess.run(
            [tools.docker(), "ps", "-q", *(["-a"] if all_ else []),
             "--filter", f"label=com.docker.compose.project={self.project}"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        if not ids:
            return []
        out = subprocess.run(
            [tools.docker(), "inspect", *ids], capture_output=True, text=True, check=True
        ).stdout
        return json.loads(out)

    def states(self) -> dict[str, str]:
        """{container name: healthy | starting | unhealthy | running | exited N | ...}."""
        result = {}
        for c in self.containers():
            state = c["State"]
            if state["Status"] == "exited":
                result[c["Name"].lstrip("/")] = f"exited {state['ExitCode']}"
            elif state.get("Health"):
                result[c["Name"].lstrip("/")] = state["Health"]["Status"]
            else:
                result[c["Name"].lstrip("/")] = state["Status"]
        return result

    def service_states(self) -> dict[str, str]:
        """{service: state} of each service's first container (as ``states``)."""
        states = self.states()
        return {
            self.service_of(c): states[c["Name"].lstrip("/")]
            for c in self.containers()
            if c["Config"]["Labels"]["com.docker.compose.container-number"] == "1"
        }

    def service_of(self, container: dict) -> str:
        """The compose service a container belongs to."""
        return container["Config"]["Labels"]["com.docker.compose.service"]

    def wait_healthy(self, timeout_s: float) -> None:
        """Until every service is healthy (one-shot services: exited 0).

        Raises:
            TimeoutError: with each container's state, and the log tail of those not ready.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            containers = self.containers()
            states = self.states()
            ready = bool(containers) and all(
                states[c["Name"].lstrip("/")]
                == ("exited 0" if self.service_of(c) in ONE_SHOT else "healthy")
                for c in containers
            )
            if ready:
                return
            if time.monotonic() > deadline:
                tails = {
                    name: self.logs(name, tail=15)
                    for name, state in states.items()
                    if state not in ("healthy", "exited 0")
                }
                raise TimeoutError(f"not healthy in {timeout_s:.0f} s: {states}\n{tails}")
            time.sleep(0.5)

    def logs(self, container: str, tail: int = 200) -> str:
        """The last lines a container wrote (stdout and stderr)."""
        done = subprocess.run(
            [tools.docker(), "logs", "--tail", str(tail), container],
            capture_output=True,
            text=True,
        )
        return done.stdout + done.stderr

    def container(self, service: str, index: int = 1) -> dict:
        """``docker inspect`` of one container of a service (1: the first replica)."""
        for c in self.containers():
            labels = c["Config"]["Labels"]
            if labels["com.docker.compose.service"] == service and labels[
                "com.docker.compose.container-number"
            ] == str(index):
                return c
        raise LookupError(f"no container {index} of {service} in {self.project}")

    def address(self, service: str, index: int = 1) -> str:
        """A container's address on the project's network (reachable from this host)."""
        networks = self.container(service, index)["NetworkSettings"]["Networks"]
        return next(iter(networks.values()))["IPAddress"]
