"""The peer as a managed process (started and stopped like a tritonserver)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from bench.harness import affinity
from bench.peers.microbatcher.models import MODEL_NAME, served_model
from paths import REPO_ROOT
from processes.managed import HttpProcess

log = logging.getLogger(__name__)


# Running it as a process ------------------------------------------------------------------
class PeerServer(HttpProcess):
    """The peer as a subprocess (``python -m bench.peers.microbatcher``), optionally pinned to CPUs.

    Use as a context manager, or call start() and stop().
    """

    name = "peer"
    poll_interval = 0.1

    def __init__(
        self,
        model_path: Path | None,
        port: int = 0,
        host: str = "127.0.0.1",
        intra_op_threads: int = 1,
        max_batch: int | None = None,
        max_wait_ms: float = 2.0,
        cpus: list[int] | None = None,
        log_path: Path | None = None,
        model_name: str = MODEL_NAME,
    ):
        """See create_app() for the model arguments; ``model_path`` None serves zeros.

        Raises:
            ValueError: ``model_name`` is not one the peer serves.
        """
        served_model(model_name)  # fail here, not in the subprocess
        super().__init__(host, port, log_path)
        self.model_path = model_path
        self.intra_op_threads = intra_op_threads
        self.max_batch = max_batch
        self.max_wait_ms = max_wait_ms
        self.cpus = cpus
        self.model_name = model_name

    def command(self) -> list[str]:
        """The command line: the CLI below, behind ``taskset -c`` when CPUs are given."""
        args = [sys.executable, "-m", "bench.peers.microbatcher", "--model-name", self.model_name]
        args += ["--host", self.host, "--port", str(self.port)]
        args += ["--threads", str(self.intra_op_threads), "--max-wait-ms", str(self.max_wait_ms)]
        if self.max_batch is not None:
            args += ["--max-batch", str(self.max_batch)]
        args += ["--null"] if self.model_path is None else ["--model", str(self.model_path)]
        if self.cpus:
            args = affinity.pinned(self.cpus, args)
        return args

    def start(self, timeout: float = 60.0) -> PeerServer:
        """Start it in the repository, where ``python -m`` finds bench, and wait until ready.

        Ready: /v2/health/ready answers 200.

        Raises:
            ServerStartError: it exited or was not ready in time; the message ends with its log.
        """
        return super().start(timeout, cwd=REPO_ROOT)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (uvicorn finishes in-flight requests), SIGKILL if it does not exit in time."""
        return super().stop(timeout)
