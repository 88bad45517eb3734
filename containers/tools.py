"""The container tools this host has: the docker client that builds with BuildKit, Compose.

Both are chosen once per process. Docker's own CLI from version 23 builds with BuildKit only
through its buildx plugin; Debian's docker.io (20.10) client still has BuildKit built in
(``DOCKER_BUILDKIT=1``). Compose v2 (``docker compose``) where the plugin answers, else
Compose 1.29 (``docker-compose``); $COMPOSE names another command line.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess

from paths import REPO_ROOT

DOCKER = REPO_ROOT / "docker"  # the deployment files: Dockerfiles, compose, engine.sh
ENGINE_SCRIPT = DOCKER / "engine.sh"
# Debian's docker.io client, which still builds with BuildKit without the buildx plugin.
DEBIAN_DOCKER = "/usr/bin/docker"


def _answers(command: list[str]) -> bool:
    try:
        done = subprocess.run(command, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@functools.cache
def docker() -> str:
    """The docker client (``docker`` on PATH)."""
    found = shutil.which("docker")
    if not found:
        raise FileNotFoundError("no docker client: apt-get install docker.io")
    return found


@functools.cache
def build_command() -> list[str]:
    """``docker build`` with BuildKit (the Dockerfiles use RUN --mount and skip unused stages).

    Raises:
        FileNotFoundError: no client here builds with BuildKit.
    """
    if _answers([docker(), "buildx", "version"]):
        return [docker(), "buildx", "build", "--load"]
    for client in (docker(), DEBIAN_DOCKER):
        version = subprocess.run(
            [client, "version", "--format", "{{.Client.Version}}"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if version and int(version.split(".")[0]) < 23:
            return ["env", "DOCKER_BUILDKIT=1", client, "build"]
    raise FileNotFoundError(
        "no docker client that builds with BuildKit: install the buildx plugin, or Debian's "
        "docker.io (its client has BuildKit built in)"
    )


@functools.cache
def compose() -> list[str]:
    """Compose's command line: $COMPOSE, ``docker compose`` (v2) or ``docker-compose`` (1.29).

    Raises:
        FileNotFoundError: neither is installed.
    """
    if os.environ.get("COMPOSE"):
        return shlex.split(os.environ["COMPOSE"])
    if _answers([docker(), "compose", "version"]):
        return [docker(), "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise FileNotFoundError("no Compose: apt-get install docker-compose, or Compose v2")


def engine_answers() -> bool:
    """Whether a Docker daemon answers the docker client now (nothing is started)."""
    return _answers([docker(), "version", "--format", "{{.Server.Version}}"])


def start_engine() -> subprocess.CompletedProcess:
    """docker/engine.sh start: a daemon that answers, started here if need be (see the script)."""
    return subprocess.run(
        ["bash", str(ENGINE_SCRIPT), "start"], capture_output=True, text=True, timeout=120
    )


def stop_engine() -> subprocess.CompletedProcess:
    """docker/engine.sh stop: stops only a dockerd that ``start_engine`` started."""
    return subprocess.run(
        ["bash", str(ENGINE_SCRIPT), "stop"], capture_output=True, text=True, timeout=120
    )
