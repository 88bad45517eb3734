"""The images of the CPU stack: this repository's CPU image and the Hub images beside it.

Where a registry is reachable, the stack runs the images users pull: the CPU image is built on
``python:3.11-slim-bookworm`` and nginx, redis, prometheus and alertmanager are the Hub images
that docker/docker-compose.yml names. Where none is (``--from debian``, or ``auto`` when the
base cannot be pulled), the same software comes from Debian 12's packages: ``mmdebstrap`` writes
a root file system and ``docker import`` makes it an image, once per package list (the tag
holds its hash), and docker/debian.Dockerfile shapes the service images like their Hub
originals.

Returns the compose variables that name the chosen images (``TRITON_IMAGE``, ``NGINX_IMAGE``,
...), which ``containers.stack`` passes to Compose.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import time
from pathlib import Path

from containers import tools
from paths import REPO_ROOT

log = logging.getLogger(__name__)

DOCKER = tools.DOCKER
DOCKERFILE = DOCKER / "Dockerfile"
SERVICES_DOCKERFILE = DOCKER / "debian.Dockerfile"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
CPU_TARGET = "cpu"
TRITON_IMAGE = "triton-model-repository:cpu"
SUITE = "bookworm"  # Debian 12, the base of python:3.11-slim-bookworm
# The Debian equivalent of python:3.11-slim-bookworm: Python 3.11 with venv and its shared
# libpython (the Python backend's stub links it), CA certificates, useradd.
PYTHON_PACKAGES = ("python3", "python3-venv", "libpython3.11", "ca-certificates", "netbase",
                   "tzdata", "passwd")  # fmt: skip
# One root file system for the service stand-ins (docker/debian.Dockerfile): the same
# software as the Hub images, and curl/wget, which their healthchecks call.
SERVICE_PACKAGES = ("nginx", "libnginx-mod-http-js", "redis-server", "prometheus",
                    "prometheus-alertmanager", "ca-certificates", "curl", "wget")  # fmt: skip
# docker/debian.Dockerfile's stage of each compose image variable.
SERVICE_STAGES = {"NGINX_IMAGE": "nginx", "REDIS_IMAGE": "redis", "PROMETHEUS_IMAGE": "prometheus",
                  "ALERTMANAGER_IMAGE": "alertmanager"}  # fmt: skip
LOCAL = "triton-model-repository"  # the repository of every image built here


def hub_images(compose_file: Path = COMPOSE_FILE) -> dict[str, str]:
    """{variable: default image} of each ``${NAME_IMAGE:-image}`` in the compose file."""
    return dict(re.findall(r"\$\{(\w+_IMAGE):-([^}]+)\}", compose_file.read_text()))


def cpu_base_default(dockerfile: Path = DOCKERFILE) -> str:
    """The CPU image's default base, as the Dockerfile's ``ARG CPU_BASE`` names it."""
    match = re.search(r"^ARG CPU_BASE=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    if not match:
        raise ValueError(f"{dockerfile}: no ARG CPU_BASE")
    return match.group(1)


def debian_tag(name: str, packages: tuple[str, ...]) -> str:
    """The tag of a root file system of these packages: a new list gets a new image."""
    digest = hashlib.sha256(" ".join((SUITE, *sorted(packages))).encode()).hexdigest()[:12]
    return f"{LOCAL}/{name}:{SUITE}-{digest}"


def exists(image: str) -> bool:
    """Whether the engine has this image."""
    done = subprocess.run(
        [tools.docker(), "image", "inspect", image], capture_output=True, timeout=60
    )
    return done.returncode == 0


def pull(image: str, timeout_s: float = 120) -> bool:
    """Whether the image is here or could be pulled (no registry: False, quickly)."""
    if exists(image):
        return True
    try:
        done = subprocess.run(
            [tools.docker(), "pull", "-q", image], capture_output=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def debian_root(name: str, packages: tuple[str, ...]) -> str:
    """An image of Debian 12 minbase with these packages (mmdebstrap | docker import).

    Built once per package list; needs root and Debian's mmdebstrap.
    """
    image = debian_tag(name, packages)
    if exists(image):
        return image
    started = time.monotonic()
    strap = subprocess.Popen(
        ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(packages)}",
         SUITE, "-"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    imported = subprocess.run(
        [tools.docker(), "import", "-c", 'CMD ["/bin/bash"]', "-", image],
        stdin=strap.stdout,
        capture_output=True,
        text=True,
    )
    strap.stdout.close()
    if strap.wait() != 0 or imported.returncode != 0:
        raise RuntimeError(f"mmdebstrap | docker import {image} failed: {imported.stderr}")
    log.info("built %s from Debian's packages in %.0f s", image, time.monotonic() - started)
    return image


def pip_cert() -> str | None:
    """The CA bundle pip trusts here ($PIP_CERT or pip's config), for a TLS-intercepting proxy."""
    cert = os.environ.get("PIP_CERT")
    if not cert:
        done = subprocess.run(
            ["python3", "-m", "pip", "config", "get", "global.cert"],
            capture_output=True,
            text=True,
        )
        cert = done.stdout.strip() if done.returncode == 0 else None
    return cert if cert and Path(cert).is_file() else None


def build(dockerfile: Path, target: str, tag: str, context: Path, args: dict[str, str]) -> None:
    """``docker build`` of one stage with BuildKit.

    On the host's network (the bridge of a dockerd without iptables has no way out; the host's
    network works with either), with the CA bundle pip trusts as a build secret.
    """
    command = [*tools.build_command(), "-f", str(dockerfile), "--target", target, "-t", tag]
    command += ["--network", "host"]
    for name, value in args.items():
        command += ["--build-arg", f"{name}={value}"]
    if cert := pip_cert():
        command += ["--secret", f"id=pip_cert,src={cert}"]
    started = time.monotonic()
    done = subprocess.run([*command, str(context)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    log.info("built %s (%s) in %.0f s", tag, target, time.monotonic() - started)


def build_all(source: str = "auto") -> dict[str, str]:
    """Build the CPU stack's images; the compose variables that name them.

    Args:
        source: ``registry`` (pull the Hub images and the Python base), ``debian`` (build their
            stand-ins from Debian's packages) or ``auto`` (registry where the Python base can
            be pulled, else debian).
    """
    base = cpu_base_default()
    if source == "auto":
        source = "registry" if pull(base) else "debian"
        log.info(
            "images: %s (%s %s)", source, base, "pulled" if source == "registry" else "unavailable"
        )
    variables = {}
    if source == "debian":
        base = debian_root("python", PYTHON_PACKAGES)
        services = debian_root("debian-services", SERVICE_PACKAGES)
        for variable, stage in SERVICE_STAGES.items():
            tag = f"{LOCAL}/{stage}:debian"
            build(SERVICES_DOCKERFILE, stage, tag, DOCKER, {"DEBIAN_SERVICES": services})
            variables[variable] = tag
    else:
        for variable in SERVICE_STAGES:
            image = hub_images()[variable]
            if not pull(image):
                raise RuntimeError(f"cannot pull {image}: use --from debian")
    build(DOCKERFILE, CPU_TARGET, TRITON_IMAGE, REPO_ROOT, {"CPU_BASE": base})
    variables |= {"TRITON_IMAGE": TRITON_IMAGE, "CPU_BASE": base}
    return variables
