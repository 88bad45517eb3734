"""nginx in front of tritonservers as a managed process, for the tests and for local use.

``Nginx`` runs Debian's nginx as the current user from a temp prefix (pid, temp files, the
rendered config and the access log there, nothing under /etc or /var).
"""

from __future__ import annotations

import os
import pwd
import shutil
import ssl
import tempfile
from dataclasses import replace
from pathlib import Path

from gateway.nginx import config, rollout
from processes.managed import ManagedProcess

__all__ = ["Nginx"]


class Nginx(ManagedProcess):
    """nginx in front of tritonservers, run from a temp prefix; a context manager.

    Takes the gateway's config whole (``gateway.nginx.config.Gateway``), as ``render`` does.
    At start, listen ports of 0 become free ones, a rollout's shares file goes in the prefix
    (``python -m gateway.nginx rollout --shares-file`` with ``shares_file`` moves its shares), and
    nginx started as root keeps its workers as that user; ``gateway`` is then the config as
    rendered.

        with Nginx(Gateway(Upstreams.of(server))) as nginx:
            ...  # nginx.http_url, nginx.grpc_url
    """

    name = "nginx"

    def __init__(self, gateway: config.Gateway, log_path: Path | None = None):
        super().__init__(log_path)
        self.binary = config.find_nginx()
        self.gateway = gateway
        if gateway.tls is not None:
            # The readiness probe asks nginx itself, on loopback, whether it serves: it checks
            # no certificate (which clients check against their own CAs).
            self.ready_context = ssl.create_default_context()
            self.ready_context.check_hostname = False
            self.ready_context.verify_mode = ssl.CERT_NONE
        self.prefix: Path | None = None

    @property
    def host(self) -> str:
        """The address nginx listens on."""
        return self.gateway.listen.host

    @property
    def http_port(self) -> int:
        """The HTTP port (0 until ``prepare`` picks a free one, where it was 0)."""
        return self.gateway.listen.http_port

    @property
    def grpc_port(self) -> int:
        """The gRPC port (0 until ``prepare`` picks a free one, where it was 0)."""
        return self.gateway.listen.grpc_port

    @property
    def http_url(self) -> str:
        """host:port of nginx's HTTP listener (what tritonclient.http expects)."""
        return self.address(self.http_port)

    @property
    def grpc_url(self) -> str:
        """host:port of nginx's gRPC listener."""
        return self.address(self.grpc_port)

    @property
    def ready_url(self) -> str:
        """The URL of nginx's own readiness location (not the upstreams')."""
        scheme = "http" if self.gateway.tls is None else "https"
        return f"{scheme}://{self.http_url}/nginx-ready"

    @property
    def access_log(self) -> Path:
        """The access log (in the prefix, unless given elsewhere): with shaping or a rollout."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / self.gateway.runtime.access_log

    @property
    def shares_file(self) -> Path:
        """A rollout's shares file (inside the prefix): what ``gateway.nginx.rollout`` moves."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / rollout.SHARES_FILE

    @property
    def config_path(self) -> Path:
        """The rendered config (inside the prefix)."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / "nginx.conf"

    def prepare(self) -> None:
        """Pick free ports, make the prefix and write the rendered config there."""
        listen = self.gateway.listen
        listen = replace(
            listen,
            http_port=self.port_or_free(listen.http_port),
            grpc_port=self.port_or_free(listen.grpc_port),
        )
        runtime = self.gateway.runtime
        if runtime.user is None and os.geteuid() == 0:
            # Started as root, nginx runs its workers as `nobody`, who cannot enter the 0700
            # temp prefix; keep them as the user we are.
            runtime = replace(runtime, user=pwd.getpwuid(os.geteuid()).pw_name)
        self.gateway = replace(self.gateway, listen=listen, runtime=runtime)
        self.prefix = Path(tempfile.mkdtemp(prefix="nginx-"))
        (self.prefix / "tmp").mkdir()
        self.access_log.parent.mkdir(parents=True, exist_ok=True)
        if self.gateway.rollout is not None:
            canary = replace(self.gateway.rollout, shares_file=str(self.shares_file))
            self.gateway = replace(self.gateway, rollout=canary)
            rollout.write(self.shares_file, canary.shares)
        self.config_path.write_text(config.render(self.gateway))

    def command(self) -> list[str]:
        """``nginx -p PREFIX -c CONF -e stderr -g 'daemon off;'`` (in the foreground)."""
        return [
            self.binary,
            "-p",
            f"{self.prefix}/",
            "-c",
            str(self.config_path),
            # The error log before the config is read: the default may be an unwritable file.
            "-e",
            "stderr",
            "-g",
            "daemon off;",
        ]

    def stop(self, timeout: float = 10.0, stop_requests=None) -> int | None:
        """Stop nginx (SIGTERM is its fast shutdown); the prefix goes with it."""
        return super().stop(timeout, stop_requests)

    def cleanup(self) -> None:
        """Remove the prefix (config, temp files)."""
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)
