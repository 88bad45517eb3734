"""The processes a run measures: Triton under test (revived when it dies) and the raw engine.

Also the machine they run on, for the report's method section.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import tritonclient.http as http

from bench.harness import affinity, stats, trace, variants
from bench.harness.plan import EMBED, EMBED_MODELS, ENCODERS, ONNX, Plan, padding_step, stats_models
from bench.harness.raw import STAGE_KIND
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding
from server import Server, ServerConfig
from server.launcher import find_installation
from server.stubs import stub_model


def peer_token_counts(url: str, model: str = EMBED) -> tuple[float, float]:
    """(real, padded) tokens the FastAPI peer's batcher has run so far (its statistics)."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as response:
        entry = json.load(response)["model_stats"][0]
    counts = entry["token_stats"]
    return counts["tokens"], counts["padded_tokens"]


def server_config(cpus: list[int]) -> ServerConfig:
    """A pinned server on free ports, in explicit model control, started with no model loaded.

    ``TritonUnderTest`` loads the models, each with the config of the variant measured.
    """
    return ServerConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        cpus=cpus,
        extra_args=["--model-control-mode=explicit"],
    )


def measure_raw(cpus: list[int], threads: int, plan: Plan, encoders: bool = True) -> dict:
    """The raw engine, pinned to the server's cores with the server's thread budget.

    Returns:
        {kind: {batch size: items/s}} for the classifier ("model"), the classify pipeline
        ("pipeline") and, with ``encoders``, the embed pipeline per encoder ("embed", ...).
    """
    cmd = [
        sys.executable,
        "-m",
        "bench.harness.raw",
        f"--onnx={ONNX}",
        f"--threads={threads}",
        f"--seconds={plan.raw_seconds}",
        "--model-batches=" + ",".join(map(str, plan.raw_model_batches)),
        "--pipeline-batches=" + ",".join(map(str, plan.raw_pipeline_batches)),
        "--embed-batches=" + ",".join(map(str, plan.raw_embed_batches)),
    ]
    if encoders and plan.raw_embed_batches:
        cmd += [f"--encoder={name}={path}" for name, path in ENCODERS.items()]
    if encoders and plan.raw_mixed_batches:
        cmd += [
            f"--mixed-encoder={ENCODERS[EMBED]}",
            "--mixed-batches=" + ",".join(map(str, plan.raw_mixed_batches)),
        ]
    done = subprocess.run(affinity.pinned(cpus, cmd), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"raw engine failed ({done.returncode}):\n{done.stderr[-3000:]}")
    raw = json.loads(done.stdout)
    # A curve of no batch sizes is left out: it was not measured.
    return {
        kind: {int(k): v for k, v in curve.items()}
        for kind, curve in raw.items()
        if isinstance(curve, dict) and curve
    }


def measure_stages(cpus: list[int], seconds: float) -> dict[str, float]:
    """The raw classify pipeline's stages at batch 1, ms per image, pinned to ``cpus``."""
    cmd = [
        sys.executable, "-m", "bench.harness.raw", f"--onnx={ONNX}", "--threads=1",
        f"--seconds={seconds}", "--stages", "--model-batches=", "--pipeline-batches=",
    ]  # fmt: skip
    done = subprocess.run(affinity.pinned(cpus, cmd), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"raw stages failed ({done.returncode}):\n{done.stderr[-3000:]}")
    curves = json.loads(done.stdout)
    return {
        kind.removeprefix(STAGE_KIND): 1000 / curve["1"]
        for kind, curve in curves.items()
        if kind.startswith(STAGE_KIND)
    }


# The cases whose ratios to the raw pipeline (and to each other, through it) are targets: each is
# measured between two readings of the raw pipeline on the same core, seconds apart.
REFERENCED = (classification.ENSEMBLE, classification.FUSED)


REFERENCE_BATCHES = (1, 4)  # batch 1 for concurrency 1; 4, the best batch here, for saturation


class RawReference:
    """The raw classify pipeline in a long-lived process on the server's cores, on request.

    This machine's speed drifts by tens of percent within a minute (docs/performance.md), more
    than the gaps the targets are about: a served case is only comparable with a raw reading
    taken seconds from it, under the same drift. ``measure`` is that reading (``bench.harness.raw
    --serve``; the process idles between readings).
    """

    def __init__(self, cpus: list[int], seconds: float = 1.0):
        self.seconds = seconds
        cmd = affinity.pinned(
            cpus,
            [sys.executable, "-m", "bench.harness.raw", f"--onnx={ONNX}", "--threads=1", "--serve"],
        )
        self.process = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def measure(self) -> dict[int, float]:
        """Images/s of the raw pipeline at each of REFERENCE_BATCHES, now."""
        out = {}
        for batch in REFERENCE_BATCHES:
            self.process.stdin.write(f"{batch} {self.seconds}\n")
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the raw reference exited ({self.process.poll()})")
            out[batch] = json.loads(line)["images_per_s"]
        return out

    def close(self) -> None:
        """Stop the process."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def process_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of a server and each of its stubs: pid → (name, seconds)."""
    out = {}
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:  # gone: nothing to say
        return out
    for process in processes:
        try:
            times = process.cpu_times()
            served = stub_model(process.pid)
            name = served[0] if served else process.name()
            out[process.pid] = (name, times.user + times.system)
        except psutil.Error:  # gone meanwhile
            continue
    return out


def cpu_per_item(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], items: int
) -> dict[str, float] | None:
    """CPU ms per item by process name, from two ``process_cpu`` snapshots (None: no item)."""
    if not items:
        return None
    out: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        if pid in before:
            out[name] = out.get(name, 0.0) + (seconds - before[pid][1]) * 1000 / items
    return out


class TritonUnderTest:
    """The tritonserver a run measures: each variant in a fresh server, restarted if it fails.

    tritonserver 2.51 has aborted, and once hung after corrupting its heap, while old instances
    of Python-backend models unloaded (docs/triton-2.51.md). So a variant is never swapped in
    by reloading steps: it gets a fresh server in explicit model control, into which every model
    is loaded once (the variant's steps with their config overrides, the rest as configured).
    Only ensembles, which run no Python, are reloaded in place (embed's response cache on/off).
    A server that exits or stops answering is replaced by a fresh one with the same variant;
    each server's log is kept as ``tritonserver[-<n>].log``.
    """

    def __init__(self, config: ServerConfig, out_dir: Path, network_timeout_s: float = 30.0):
        self.config = config
        self.out_dir = out_dir
        self.network_timeout_s = network_timeout_s
        self.server: Server | None = None
        self.client: http.InferenceServerClient | None = None
        self.starts = 0
        self.deaths = 0
        self._loaded: tuple[variants.Variant, bool] | None = None
        self._wanted: tuple[variants.Variant, bool] | None = None
        self._hung = False

    def start(self) -> TritonUnderTest:
        """Start a server on fresh free ports with no model loaded."""
        self.starts += 1
        name = "tritonserver.log" if self.starts == 1 else f"tritonserver-{self.starts}.log"
        # Ports of 0 are filled in by the server: each start gets a copy with fresh ones. Tracing
        # is possible but off; the traced cases turn it on for their model (bench/harness/trace.py).
        traces = self.out_dir / trace.FOLDER
        traces.mkdir(parents=True, exist_ok=True)
        trace_args = trace.server_args(traces / f"trace-{self.starts}.json")
        config = dataclasses.replace(self.config, extra_args=[*self.config.extra_args, *trace_args])
        self.server = Server(config, log_path=self.out_dir / name).start()
        self.client = http.InferenceServerClient(
            self.server.http_url, network_timeout=self.network_timeout_s
        )
        self._loaded = None
        self._hung = False
        return self

    def running(self) -> bool:
        """True while the server runs."""
        return self.server is not None and self.server.running()

    def trouble(self, timeout_s: float = 10.0) -> str | None:
        """Why the server cannot be measured (it exited, or does not answer), or None."""
        if not self.running():
            status = self.server.process.returncode if self.server else None
            return f"tritonserver exited (status {status}); its log: {self._log()}"
        if self._hung or not self.server.is_ready(timeout_s):
            self._hung = True  # asked once per server: a hang does not end by itself
            return (
                f"tritonserver stopped answering within {timeout_s:.0f} s; its log: {self._log()}"
            )
        return None

    def watch(self, timeout_s: float = 10.0) -> str | None:
        """While a case runs: why to end it now (the server exited, or answers nothing), else None.

        Only silence counts here: a server that answers, even "not ready", is left to its case.
        """
        if self.running() and not self._hung:
            if self.server.answers(timeout_s):
                return None
            self._hung = True
        return self.trouble(timeout_s)

    def _log(self) -> Path | None:
        return self.server.log_path if self.server else None

    def restart(self) -> None:
        """Replace the server (killed if it still runs) by a fresh one with what it had."""
        self.deaths += 1
        if self.running():
            self.server.kill()
        self.close()
        self.start()
        if self._wanted is not None:
            self.configure(*self._wanted)

    def url(self, protocol: str) -> str:
        """host:port of the gRPC or HTTP endpoint."""
        return self.server.grpc_url if protocol == "grpc" else self.server.http_url

    def configure(self, variant: variants.Variant, cache: bool | None = None) -> None:
        """Serve ``variant`` with embed's response cache ``cache``, if not served already.

        Args:
            variant: the serving variant of the steps it names.
            cache: embed's response cache on or off; None leaves it as it is.
        """
        loaded_variant, loaded_cache = self._loaded or (None, True)  # the configs enable it
        cache = loaded_cache if cache is None else cache
        self._wanted = (variant, cache)
        if loaded_variant != variant:
            if self._loaded is not None:  # a fresh server, never a reload of Python steps
                self.close()
                self.start()
            self._load(variant, cache)
        elif loaded_cache != cache:
            name, admin = self.server.config.model_config_name, self.server.admin_headers()
            variants.set_response_cache(
                self.client, EMBED_MODELS, cache, MODEL_REPOSITORY, name, admin
            )
        self._loaded = (variant, cache)

    def _load(self, variant: variants.Variant, cache: bool) -> None:
        """Load every model of both services into the fresh server, the variant's steps first."""
        name, admin = self.server.config.model_config_name, self.server.admin_headers()
        variants.apply(self.client, variant, MODEL_REPOSITORY, name, admin)
        variants.without_text_cache(self.client, MODEL_REPOSITORY, name, admin)
        # embed's ensembles pull in their steps (as configured, or as the variant loaded them).
        variants.set_response_cache(self.client, EMBED_MODELS, cache, MODEL_REPOSITORY, name, admin)
        if classification.ENSEMBLE not in variant.ensembles:
            self.client.load_model(classification.ENSEMBLE, headers=admin)
        self.client.load_model(classification.FUSED, headers=admin)
        self.client.load_model(embedding.GRAPH_ENSEMBLE, headers=admin)

    def statistics(self) -> dict[str, dict]:
        """Statistics of every model the report reads that this server loads."""
        return stats.snapshot(self.client, stats_models(self.server.config.model_config_name))

    def token_counts(self, model: str) -> tuple[float, float]:
        """(real, padded) tokens that ``model``'s padding step has counted so far."""
        step, version = padding_step(model, self.server.config.model_config_name)
        with urllib.request.urlopen(self.server.metrics_url, timeout=10) as response:
            page = response.read().decode()
        return stats.token_counts(page, step, version)

    def close(self) -> None:
        """Stop the server; nothing it started stays behind."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> TritonUnderTest:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def machine() -> dict[str, str]:
    """What the report says about where it ran: the CPU, Python, tritonserver, tritonclient."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    installed = find_installation()
    where = "PyPI nvidia-pytriton" if installed.bundled else str(installed.binary)
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": sys.version.split()[0],
        "tritonserver": f"{installed.version or '(version unknown)'} ({where})",
        "tritonclient": importlib.metadata.version("tritonclient"),
    }
