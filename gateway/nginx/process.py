"""nginx in front of tritonservers as a managed process, for the tests and for local use.

``Nginx`` runs Debian's nginx as the current user from a temp prefix (pid, temp files, the
rendered config and the shaping log there, nothing under /etc or /var).
"""

from __future__ import annotations

import os
import pwd
import shutil
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gateway.nginx import config, rollout
from gateway.shaping import Limits
from processes.managed import ManagedProcess

__all__ = ["Nginx"]


class Nginx(ManagedProcess):
    """nginx in front of tritonservers, run from a temp prefix; a context manager.

    Ports of 0 are replaced by free ones at start. The arguments are those of the config's
    context (``gateway.nginx.config``): upstreams, ports, ``limits`` for token buckets (None:
    no shaping), ``openai`` for OpenAI's embeddings API, ``canary`` for a rollout (``python
    -m gateway.nginx rollout --file`` with its ``rollout_path`` moves the shares), and what
    clients may hold.
    """

    name = "nginx"

    def __init__(
        self,
        http_upstreams: Sequence[str],
        grpc_upstreams: Sequence[str],
        http_port: int = 0,
        grpc_port: int = 0,
        host: str = "127.0.0.1",
        workers: int | str = "auto",
        log_path: Path | None = None,
        limits: Limits | None = None,
        openai: config.OpenAI | None = None,
        conns_per_client: int = 64,
        client_timeout: str = "10s",
        operators: Sequence[str] = (),
        tls: config.TLS | None = None,
        canary: rollout.Rollout | None = None,
    ):
        super().__init__(log_path)
        self.binary = config.find_nginx()
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        # Started as root, nginx runs its workers as `nobody`, who cannot enter the 0700 temp
        # prefix; keep them as the user we are.
        user = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() == 0 else None
        # The listen ports are those of prepare(), once the free ones are picked.
        self.gateway = config.Gateway(
            config.Upstreams(tuple(http_upstreams), tuple(grpc_upstreams)),
            config.Listen(http_port, grpc_port, host),
            config.Clients(
                conns_per_client=conns_per_client,
                timeout=client_timeout,
                operators=tuple(operators),
            ),
            config.Runtime(workers=workers, user=user),
            shaping=None if limits is None else config.Shaping(limits),
            openai=openai,
            tls=tls,
            rollout=canary,
        )
        if tls is not None:
            # The readiness probe asks nginx itself, on loopback, whether it serves: it checks
            # no certificate (which clients check against their own CAs).
            self.ready_context = ssl.create_default_context()
            self.ready_context.check_hostname = False
            self.ready_context.verify_mode = ssl.CERT_NONE
        self.prefix: Path | None = None

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
    def shaping_log(self) -> Path:
        """The request log inside the prefix: a line per shaped request, or rollout request."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / config.SHAPING_LOG

    @property
    def rollout_path(self) -> Path:
        """A rollout's shares file (inside the prefix): what ``gateway.nginx.rollout`` moves."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / rollout.ROLLOUT_FILE

    @property
    def config_path(self) -> Path:
        """The rendered config (inside the prefix)."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / "nginx.conf"

    def prepare(self) -> None:
        """Pick free ports, make the prefix and write the rendered config there."""
        self.http_port = self.port_or_free(self.http_port)
        self.grpc_port = self.port_or_free(self.grpc_port)
        self.prefix = Path(tempfile.mkdtemp(prefix="nginx-"))
        (self.prefix / "tmp").mkdir()
        self.shaping_log.parent.mkdir()
        listen = config.Listen(self.http_port, self.grpc_port, self.host)
        gateway = replace(self.gateway, listen=listen)
        if gateway.rollout is not None:
            canary = replace(gateway.rollout, shares_file=str(self.rollout_path))
            gateway = replace(gateway, rollout=canary)
            rollout.write(self.rollout_path, canary.shares)
        self.config_path.write_text(config.render(gateway))

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
