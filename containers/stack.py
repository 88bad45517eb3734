"""The compose stack of docker/ on a CPU host: up until healthy, its containers, down.

One ``Stack`` is one Compose project: docker-compose.yml with the CPU override, the images
``containers.images`` chose, and the stack's secrets (Redis and Grafana passwords, tenant keys)
as files of a state folder of its own. ``make up`` keeps that folder in ``.containers/``, so that
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


# The stack's secrets as files of the state folder, by the compose variable that names each.
SECRET_FILES = {"REDIS_PASSWORD_FILE": "redis_password",
                "GRAFANA_ADMIN_PASSWORD_FILE": "grafana_admin_password"}  # fmt: skip
LIMITS_FILE = "limits.toml"  # the gateway's limits with a key per tenant (GATEWAY_LIMITS)


def state_environment(folder: Path) -> dict[str, str]:
    """The stack's secrets, made once as files in ``folder``; the compose variables naming them.

    ``folder`` holds the Redis and Grafana passwords and the gateway's limits with keys of their
    own; nothing of it is committed. Compose mounts each file into the services that read it
    (under /run/secrets), as it is on the host, and those services run as users of their own:
    the folder is root's alone (0700), the files in it readable (0644). ``folder/env`` lists the
    variables, for ``docker-compose --env-file``. A folder from before the secrets were files
    (passwords in ``env``) keeps its passwords.
    """
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    env_file = folder / "env"
    earlier = {}
    if env_file.exists():
        lines = env_file.read_text().splitlines()
        earlier = dict(line.split("=", 1) for line in lines if "=" in line)
    limits = folder / LIMITS_FILE
    if not limits.exists():
        limits.write_text(shaping.with_secret_keys(shaping.LIMITS.read_text()))
    variables = {"GATEWAY_LIMITS": str(limits.resolve())}
    for variable, name in SECRET_FILES.items():
        path = folder / name
        if not path.exists():
            path.write_text(earlier.get(variable.removesuffix("_FILE")) or secrets.token_hex(16))
        variables[variable] = str(path.resolve())
    for path in (limits, *(folder / name for name in SECRET_FILES.values())):
        path.chmod(0o644)
    env_file.write_text("".join(f"{name}={value}\n" for name, value in variables.items()))
    env_file.chmod(0o600)
    return variables


def read_secret(variables: dict[str, str], variable: str) -> str:
    """The secret in the file that a compose variable of ``state_environment`` names."""
    return Path(variables[variable]).read_text().strip()


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

    def published(self, service: str) -> dict[int, list[tuple[str, int]]]:
        """{container port: [(host address, host port), ...]} of what a service publishes."""
        ports = self.container(service)["NetworkSettings"]["Ports"] or {}
        return {
            int(port.split("/")[0]): [
                (b["HostIp"] or "0.0.0.0", int(b["HostPort"])) for b in bindings
            ]
            for port, bindings in ports.items()
            if bindings
        }

    def address(self, service: str, index: int = 1) -> str:
        """A container's address on the project's network (reachable from this host)."""
        networks = self.container(service, index)["NetworkSettings"]["Networks"]
        return next(iter(networks.values()))["IPAddress"]
