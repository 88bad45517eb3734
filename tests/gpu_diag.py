"""The GPU diagnosis: the designs of the image service side by side on one GPU, in one run.

The first GPU run served ``classify`` (the three-step ensemble) at 0.05-0.23x the raw model, with
the GPU 4-20 % busy (docs/gpu.md). Several causes fit those figures; this run tells them apart
(docs/gpu.md, "Why served classify was slow", has the hypotheses and what each result means):

* phase A, in this process, no server: the first forward at batch sizes the model has not seen
  (cold cost per shape, with cuDNN on and off); the CUDA IPC calls the Python backend makes per
  GPU tensor, with and without ``nvidia-smi`` spawned five times a second beside them; the
  ceilings of batched JPEG decode, resize and the whole chain with a CUDA-graph model;
* phase B, one server with every variant loaded under its own name: the ensemble as served
  (V0); its classifier padded to warmed buckets (V1); pixels and logits handed over in host
  memory (V2); two classifier instances (V3); the one-step GPU design, ``classify_fused``'s
  gpu-local config (V4); V0 again once its sizes are warm (V0'); V1 with the 5 Hz sampler on
  (V5); answers checked under load; the text service (``tests/gpu_text.py``) when it is there;
* phase C, a second server with a 1 GiB CUDA pool and 512 MiB of pinned memory: V1 again (V6).

Each load level gets a thrown-away warm-up, then a measured perf_analyzer run (``--async``,
gRPC, three fixed windows) with Triton's statistics, every process's CPU seconds and the GPU's
busy share (one ``nvidia-smi dmon`` for the whole phase) taken right around it. Each phase has
a deadline and the results are written after every step, so a run cut short keeps what it
measured: ``gpu-diag.json``, ``gpu-diag.md``, the server logs (grepped for the Python backend's
CUDA pool and IPC messages), ``dmon.txt``.

    make gpu-bundle GPU_PYTHON=3.12                                 # here, once
    python3 -m tests.gpu_diag run --bundle .gpu-bundle --out DIR    # the GPU host: make gpu-diag
    python -m tests.gpu_diag run --smoke --out DIR                  # here, CPU: every code path

Only the standard library is imported at module level (the GPU host gets the rest from the
bundle, as in tests/gpu_check.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests import gpu_check

log = logging.getLogger("gpu_diag")

STEPS = ("preprocess", "classifier", "postprocess")
# The Python backend's and core's messages that say how GPU tensors travelled (python_backend
# r24.10 src/python_be.cc, pb_memory.cc; core src/memory.cc); docs/gpu.md reads them.
LOG_SIGNS = (
    "falling back to pinned system memory",
    "Failed to share CUDA memory pool",
    "Failed to initialize CUDA shared memory pool",
    "Failed to allocate memory from CUDA memory pool",
    "will use CUDA IPC",
    "Forcing CPU only input tensors",
    "failed to copy data",
    "Failed to load GPU buffers",
    "CUDA memory pool is created on device",
)
POOL_FLAGS = (
    "--cuda-memory-pool-byte-size=0:1073741824",
    "--pinned-memory-pool-byte-size=536870912",
)
BUCKETS = "8,16,32,64,128"  # the gpu-local classifier's max_batch_size is 128
# The one step with a TensorRT engine of the classifier, where the host's Python has TensorRT.
TENSORRT_VARIANT = "classify_fused_trt"
# Answers checked under load: the ensemble as served and the one-step design.
ANSWERS_CHECKED = ("classify", "classify_fused")


@dataclass
class Plan:
    """What one run measures, and by when; ``smoke`` shrinks it to a CPU rehearsal."""

    cold_sizes: tuple[int, ...] = (3, 7, 12, 24, 33, 47, 52, 61, 77, 96, 113, 127)
    cold_sizes_without_cudnn: tuple[int, ...] = (5, 19, 41)
    ipc_calls: int = 2000
    ipc_open_close: int = 300
    ceiling_batches: tuple[int, ...] = (64, 128, 256)
    ceiling_seconds: float = 1.0
    # (label, model, concurrency levels), in the order they run.
    levels: tuple[tuple[str, str, tuple[int, ...]], ...] = (
        ("V0", "classify", (32, 128)),
        ("V1", "classify_bucket", (32, 128)),
        ("V2", "classify_bucket_cpu", (32, 128)),
        ("V3", "classify_bucket_x2", (128,)),
        ("V4", "classify_fused", (32, 128, 256)),
        ("V0'", "classify", (128,)),
    )
    sampled_level: tuple[str, str, int] = ("V5", "classify_bucket", 128)
    sampled_after: str = "V0'"  # the level after which the sampled one runs
    pool_levels: tuple[int, ...] = (128, 256)
    load_check_requests: int = 256
    load_check_concurrency: int = 128
    warmup_ms: int = 1000  # 0: no warm-up run
    measure_ms: int = 2000
    perf_extra: tuple[str, ...] = ("--async",)
    instances_per_gpu: int | None = None
    # Seconds from the start by which each part must be done (A, TensorRT, phase B's image
    # levels, its answers and text service, and the whole run), or have begun (phase C: about
    # a minute); the whole run, with the servers' stops, stays under 8 minutes.
    phase_a_s: float = 75.0
    tensorrt_s: float = 195.0
    levels_s: float = 270.0
    text_s: float = 350.0
    phase_c_after_s: float = 365.0
    budget_s: float = 455.0
    text: bool = True
    rehearsal: bool = False  # a CPU run: the text service's part takes its smoke plan too

    def models(self) -> tuple[str, ...]:
        """The top-level models the first server loads (their steps load with them)."""
        named = [model for _, model, _ in self.levels] + [self.sampled_level[1]]
        return tuple(dict.fromkeys([*named, *ANSWERS_CHECKED]))

    @classmethod
    def smoke(cls) -> Plan:
        """Every code path on a CPU in a couple of minutes; the figures mean nothing."""
        # One level of each kind of model: the ensemble, its variant with host hand-over,
        # the one step; V1's model runs with the sampler (V5) and on the second server (V6).
        # V0' is V0's model again: nothing of it is new here.
        two = (("V0", "classify", (2,)), ("V2", "classify_bucket_cpu", (2,)))
        two += (("V4", "classify_fused", (2,)),)
        return cls(
            cold_sizes=(2, 3),
            cold_sizes_without_cudnn=(5,),
            ipc_calls=10,
            ipc_open_close=5,
            ceiling_batches=(4,),
            ceiling_seconds=0.2,
            levels=two,
            sampled_level=("V5", "classify_bucket", 2),
            sampled_after="V4",
            pool_levels=(2,),
            load_check_requests=8,
            load_check_concurrency=4,
            warmup_ms=0,
            measure_ms=500,
            perf_extra=(
                "--async",
                "--measurement-mode=count_windows",
                "--measurement-request-count=5",
            ),
            instances_per_gpu=1,
            phase_a_s=120.0,
            tensorrt_s=130.0,
            levels_s=300.0,
            text_s=360.0,
            phase_c_after_s=380.0,
            budget_s=440.0,
            rehearsal=True,
        )


@dataclass
class Results:
    """Everything measured so far; written after every step."""

    out: Path
    host: dict = field(default_factory=dict)
    cold: dict = field(default_factory=dict)
    ipc: dict = field(default_factory=dict)
    ceiling: dict = field(default_factory=dict)
    levels: list[dict] = field(default_factory=list)
    answers: dict = field(default_factory=dict)
    text: dict = field(default_factory=dict)
    tensorrt: dict = field(default_factory=dict)
    log_signs: dict = field(default_factory=dict)
    stages_s: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def save(self) -> None:
        """gpu-diag.json and gpu-diag.md in ``out``."""
        data = {k: v for k, v in asdict(self).items() if k != "out"}
        (self.out / "gpu-diag.json").write_text(json.dumps(data, indent=2, default=str))
        (self.out / "gpu-diag.md").write_text(markdown(self))


# Phase A: in this process ------------------------------------------------------------------------
def host_facts() -> dict:
    """What decides cold costs and what the run can use: versions, CUDA settings, TensorRT."""
    import torch

    facts = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING", "(unset: lazy from 12.2)"),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
    }
    if shutil.which("nvidia-smi"):
        query = "--query-gpu=driver_version,persistence_mode,compute_mode,clocks.max.sm"
        done = subprocess.run(
            ["nvidia-smi", "-i", "0", query, "--format=csv,noheader"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        facts["nvidia-smi"] = done.stdout.strip()
    try:
        import tensorrt

        facts["tensorrt"] = tensorrt.__version__
    except Exception as exc:  # noqa: BLE001 - any failure means "no TensorRT here"
        facts["tensorrt"] = f"not importable: {type(exc).__name__}: {exc}"
    return facts


def cold_sizes(plan: Plan, device: str, weights: Path | None) -> dict:
    """First and second forward at batch sizes the served classifier has not seen (H1).

    The classifier as served (FP16, channels-last, cuDNN heuristics, warmed at batch 1 only),
    each forward timed to completion; then a few more new sizes with cuDNN off.
    """
    import torch

    from pipelines.gpu_classifier import ImageClassifier

    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    torch.backends.cudnn.benchmark = False
    model = ImageClassifier(device, weights)

    def timed(size: int) -> float:
        pixels = torch.zeros((size, 3, 224, 224), dtype=torch.uint8, device=device)
        sync()
        start = time.perf_counter()
        model.logits(pixels)
        sync()
        return round((time.perf_counter() - start) * 1000, 2)

    out = {"sizes": {}, "without_cudnn": {}}
    for size in plan.cold_sizes:
        out["sizes"][size] = {"first_ms": timed(size), "second_ms": timed(size)}
    torch.backends.cudnn.enabled = False
    try:
        for size in plan.cold_sizes_without_cudnn:
            out["without_cudnn"][size] = {"first_ms": timed(size), "second_ms": timed(size)}
    finally:
        torch.backends.cudnn.enabled = True
    return out


IPC_CHILD = """
import sys, time
from cuda.bindings import runtime as rt
handle = rt.cudaIpcMemHandle_t()
handle.reserved = bytes.fromhex(sys.argv[1])
times = []
for _ in range(int(sys.argv[2])):
    start = time.perf_counter()
    err, ptr = rt.cudaIpcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess)
    assert err == rt.cudaError_t.cudaSuccess, err
    rt.cudaIpcCloseMemHandle(ptr)
    times.append(time.perf_counter() - start)
times.sort()
print(times[len(times) // 2] * 1e6, times[int(len(times) * 0.99)] * 1e6)
"""


def ipc_costs(plan: Plan, device: str) -> dict:
    """The CUDA IPC calls a GPU tensor costs between stub processes (H2, H3b), in microseconds.

    ``cudaIpcGetMemHandle`` on sub-pointers of one 64 MiB allocation, without and then with
    the check's old 5 Hz ``nvidia-smi`` sampler beside it; then a child process opens and closes
    the handle. Needs CUDA's Python bindings (cuda-bindings).
    """
    if device == "cpu":
        return {"skipped": "no GPU"}
    try:
        from cuda.bindings import runtime as rt
    except ImportError as exc:
        return {"skipped": f"cuda-bindings not importable: {exc}"}
    import torch

    block = torch.empty(64 << 20, dtype=torch.uint8, device=device)

    def get_handles() -> dict:
        times = []
        for i in range(plan.ipc_calls):
            start = time.perf_counter()
            err, _ = rt.cudaIpcGetMemHandle(block.data_ptr() + (i % 1024) * 65536)
            times.append(time.perf_counter() - start)
            if err != rt.cudaError_t.cudaSuccess:
                return {"error": str(err)}
        times.sort()
        return {
            "p50_us": times[len(times) // 2] * 1e6,
            "p99_us": times[int(len(times) * 0.99)] * 1e6,
        }

    out = {"get_handle": get_handles()}
    with GpuSampler(interval=0.2):
        out["get_handle_with_sampler"] = get_handles()
    _, handle = rt.cudaIpcGetMemHandle(block.data_ptr())
    child = subprocess.run(
        [sys.executable, "-c", IPC_CHILD, bytes(handle.reserved).hex(), str(plan.ipc_open_close)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if child.returncode == 0:
        p50, p99 = (float(x) for x in child.stdout.split())
        out["open_close"] = {"p50_us": p50, "p99_us": p99}
    else:
        out["open_close"] = {"error": child.stderr[-500:]}
    return out


def ceilings(plan: Plan, photos: list[bytes], device: str, weights: Path | None) -> dict:
    """img/s in this process: decode alone, decode + resize (per image and per source size),
    the model alone (eager, and bucketed with CUDA graphs) and the whole chain."""
    import numpy as np
    import torch

    from pipelines import buckets, gpu_image
    from pipelines.gpu_classifier import ImageClassifier, TorchImagePipeline

    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    decode = gpu_image._decode_jpeg() if device != "cpu" else None
    params = {"buckets": ",".join(map(str, buckets.DEFAULT)), "cuda_graphs": "yes"}
    params |= {"weights": str(weights)} if weights else {}
    fused = TorchImagePipeline({**params, "fold_batchnorm": "yes"}, device, buckets.DEFAULT[-1])
    eager = ImageClassifier(device, weights)
    out: dict = {}
    for size in plan.ceiling_batches:
        jpegs = [photos[i % len(photos)] for i in range(size)]
        row: dict = {}
        if decode is not None:
            tensors = [torch.frombuffer(j, dtype=torch.uint8) for j in jpegs]
            row["decode"] = gpu_check.timed(
                lambda t=tensors: decode(t, device), size, plan.ceiling_seconds, sync
            )

            def per_image(t=tensors):
                for frame in decode(t, device):
                    gpu_image.crop_resize(frame)

            row["decode_resize_per_image"] = gpu_check.timed(
                per_image, size, plan.ceiling_seconds, sync
            )
        row["decode_resize"] = gpu_check.timed(
            lambda j=jpegs: fused.preprocess(j), size, plan.ceiling_seconds, sync
        )
        pixels, _ = fused.preprocess(jpegs)
        row["model_eager"] = gpu_check.timed(
            lambda p=pixels: eager.logits(p), size, plan.ceiling_seconds, sync
        )
        row["model_graphs"] = gpu_check.timed(
            lambda p=pixels: fused.classifier.logits(p), size, plan.ceiling_seconds, sync
        )
        everything = np.arange(size)

        def chain(j=jpegs, rows=everything):
            batch, _ = fused.preprocess(j)
            fused.top_k(batch, rows, 5)

        row["chain"] = gpu_check.timed(chain, size, plan.ceiling_seconds, sync)
        out[size] = {k: round(v, 1) for k, v in row.items()}
    return out


def top1_on_the_cpu(photos: list[bytes], weights: Path | None) -> list[int]:
    """The CPU pipeline's top-1 per photo: Pillow, then the fp32 network, as served on a CPU."""
    import torch

    from pipelines import efficientnet_lite, image

    pixels, errors = image.preprocess_batch(photos)
    assert not any(errors), errors
    with torch.inference_mode():
        model = efficientnet_lite.load_pretrained(weights)
        return model(torch.from_numpy(pixels)).argmax(1).tolist()


# Phase B and C: the served variants ---------------------------------------------------------
def variant_configs(repository: Path, engine: Path | None = None) -> dict[str, tuple[Path, object]]:
    """name → (the model folder whose code it runs, its full config): the variants of phase B.

    With ``engine`` (a TensorRT plan of the classifier), ``classify_fused_trt`` too: the one
    step with that engine in place of PyTorch.
    """
    configs = gpu_check.gpu_local_configs(repository, ("classify", *STEPS, "classify_fused"))

    def variant(model: str, name: str, **values: str):
        source, config = gpu_check.gpu_local_configs(repository, (model,))[model]
        config.name = name
        for key, value in values.items():
            config.parameters[key].string_value = value
        configs[name] = (source, config)
        return config

    variant("classifier", "classifier_bucket", buckets=BUCKETS)
    variant("classifier", "classifier_bucket_x2", buckets=BUCKETS).instance_group[0].count = 2
    variant(
        "classifier", "classifier_bucket_cpu",
        buckets=BUCKETS, output_device="cpu", FORCE_CPU_ONLY_INPUT_TENSORS="yes",
    )  # fmt: skip
    variant("preprocess", "preprocess_cpuout", output_device="cpu").instance_group[0].count = 2
    for name, pre, cls in (
        ("classify_bucket", "preprocess", "classifier_bucket"),
        ("classify_bucket_cpu", "preprocess_cpuout", "classifier_bucket_cpu"),
        ("classify_bucket_x2", "preprocess", "classifier_bucket_x2"),
    ):
        steps = variant("classify", name).ensemble_scheduling.step
        steps[0].model_name, steps[1].model_name = pre, cls
    if engine is not None:
        variant("classify_fused", TENSORRT_VARIANT, engine=str(engine))
    return configs


class GpuSampler:
    """The first GPU run's sampler: ``nvidia-smi`` spawned every ``interval`` s (for V5, A2)."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.samples = interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None

    def _loop(self) -> None:
        query = ["nvidia-smi", "-i", "0", "--query-gpu=utilization.gpu,memory.used",
                 "--format=csv,noheader,nounits"]  # fmt: skip
        while not self._stop.is_set():
            out = subprocess.run(query, capture_output=True, text=True, check=False).stdout
            with contextlib.suppress(ValueError):
                util, mem = (float(x) for x in out.strip().split(","))
                self.samples.append((util, mem))
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.available:
            self._thread.join()

    def mean_util(self) -> float | None:
        """Mean utilization %, None without samples."""
        return (
            round(sum(u for u, _ in self.samples) / len(self.samples), 1) if self.samples else None
        )

    def max_mem(self) -> float | None:
        """Peak memory used, MiB."""
        return max(m for _, m in self.samples) if self.samples else None


def cpu_seconds(server_pid: int) -> dict[str, float]:
    """CPU seconds so far of tritonserver and of each Python-backend stub, by model instance."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(proc.name) == server_pid:
            label = "tritonserver"
        elif int(stat[1]) == server_pid and argv[0].endswith(b"triton_python_backend_stub"):
            # The instance name (python_backend r24.10 src/stub_launcher.cc builds the argv).
            label = argv[8].decode(errors="replace") if len(argv) > 8 else proc.name
        else:
            continue
        out[label] = (int(stat[11]) + int(stat[12])) / ticks
    return out


class Served:
    """The measurements against one running server."""

    def __init__(self, plan: Plan, results: Results, server, data: Path, dmon):
        import tritonclient.grpc as grpcclient

        self.plan, self.results, self.server, self.data, self.dmon = (
            plan,
            results,
            server,
            data,
            dmon,
        )
        self.grpc = grpcclient.InferenceServerClient(server.grpc_url)

    def run(self, model: str, level: int, measure_ms: int, retries: int = 1):
        from bench.harness import perf_analyzer

        run = perf_analyzer.Run(
            model=model, url=self.server.grpc_url, protocol="grpc", levels=(level,),
            input_data=self.data, measurement_ms=measure_ms, stability_percent=999.0,
            max_trials=3, extra=list(self.plan.perf_extra),
        )  # fmt: skip
        return perf_analyzer.measure(run, level, timeout=120, retries=retries)

    def level(self, label: str, model: str, level: int, server_name: str = "server1") -> None:
        """A thrown-away warm-up, then one measured level with everything around it."""
        from bench.harness import perf_analyzer, stats

        steps = steps_of(model)
        if self.plan.warmup_ms:
            with contextlib.suppress(perf_analyzer.PerfAnalyzerError):
                self.run(model, level, self.plan.warmup_ms, retries=0)
        before = stats.snapshot(self.grpc, steps, as_json=True)
        cpu_before, start = cpu_seconds(self.server.process.pid), time.monotonic()
        try:
            point = self.run(model, level, self.plan.measure_ms)
        except perf_analyzer.PerfAnalyzerError as exc:
            self.results.notes.append(f"{label} {model} c={level}: {str(exc).splitlines()[-1]}")
            self.results.save()
            return
        end = time.monotonic()
        delta = stats.delta(before, stats.snapshot(self.grpc, steps, as_json=True))
        cpu_after = cpu_seconds(self.server.process.pid)
        wall = end - start
        self.results.levels.append(
            {
                "label": label, "model": model, "server": server_name, "concurrency": level,
                "throughput": round(point.throughput, 1), "p50_ms": round(point.p50_ms, 2),
                "p99_ms": round(point.p99_ms, 2),
                "steps": {
                    m: {
                        "avg_batch": round(d.avg_batch, 2), "queue_ms": round(d.queue_ms, 2),
                        "compute_ms": round(d.compute_ms, 2), "executions": d.executions,
                        "batch_histogram": d.batch_histogram,
                        "infer_ms_by_batch": {b: round(v, 2) for b, v in d.batch_infer_ms.items()},
                    }
                    for m, d in delta.items()
                },
                # Busy share of a core per process: near 1 is host work, near 0 is waiting.
                "cpu_share": {
                    k: round((cpu_after[k] - cpu_before.get(k, 0.0)) / wall, 2)
                    for k in sorted(cpu_after)
                    if cpu_after[k] - cpu_before.get(k, 0.0) > 0.01 * wall
                },
                "gpu": self.dmon.busy(start, end),
            }
        )  # fmt: skip
        log.info("%s %s c=%s: %.0f img/s", label, model, level, point.throughput)
        self.results.save()

    def answers_under_load(self, model: str, photos: list[bytes], expected: dict) -> dict:
        """Top-1 of ``load_check_requests`` requests sent ``load_check_concurrency`` at a time."""
        from client.classify import ClassifyClient

        local, clients = threading.local(), []

        def one(i: int) -> tuple[int, int]:
            # A connection per worker, as a client keeps its own: not one per request.
            if not hasattr(local, "client"):
                local.client = ClassifyClient(self.server.grpc_url, protocol="grpc", model=model)
                clients.append(local.client)
            return i % len(photos), local.client.classify([photos[i % len(photos)]])[0].class_ids[0]

        workers = self.plan.load_check_concurrency
        try:
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                got = list(pool.map(one, range(self.plan.load_check_requests)))
        finally:
            for client in clients:
                client.close()
        out = {"requests": len(got)}
        for name, want in expected.items():
            out[f"top1_equal_{name}"] = sum(top == want[p] for p, top in got) / len(got)
        out["mismatched_photos"] = sorted({p for p, top in got if top != expected["in_process"][p]})
        return out


def steps_of(model: str) -> tuple[str, ...]:
    """The composing models whose statistics a level of ``model`` records."""
    if model == "classify_fused":
        return ("classify_fused",)
    if model == "classify":
        return STEPS
    pre = "preprocess_cpuout" if model.endswith("_cpu") else "preprocess"
    return (pre, model.replace("classify", "classifier"), "postprocess")


def grep_log(path: Path) -> dict[str, int]:
    """How often each of ``LOG_SIGNS`` appears in a server log."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return {sign: text.count(sign) for sign in LOG_SIGNS}


def tensorrt_phase(plan: Plan, results: Results, photos, device: str, weights, deadline: float):
    """Where this Python has TensorRT: the classifier's engine, built, checked and timed.

    The ONNX model is exported here from the same weights (with its parity check against
    PyTorch), the engine built by the repository's builder with the profiles of the
    classifier's gpu config, compared with that ONNX model on onnxruntime, and timed in this
    process. Returns the plan for phase B to serve from ``classify_fused`` beside PyTorch
    (None: no TensorRT, no GPU, or a step failed; ``results.tensorrt`` says which).
    """
    import numpy as np
    import torch

    from paths import MODEL_REPOSITORY

    available = results.host.get("tensorrt", "")
    if device == "cpu" or available.startswith("not importable"):
        results.tensorrt = {"built": False, "why": "no GPU" if device == "cpu" else available}
        return None
    from export import tensorrt as engines
    from pipelines import gpu_image
    from pipelines.gpu_classifier import ImageClassifier

    work = Path(tempfile.mkdtemp(prefix="gpu-diag-tensorrt-"))
    repository = work / "repository"
    source = MODEL_REPOSITORY / "classifier"
    for item in [source / "config.pbtxt", *(source / "configs").iterdir()]:
        target = repository / "classifier" / item.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(item.resolve())
    onnx = repository / "classifier" / "1" / "model.onnx"
    command = [sys.executable, "-m", "export", "efficientnet_lite0", "--output", str(onnx)]
    command += ["--weights", str(weights)] if weights else []
    started = time.monotonic()
    done = subprocess.run(command, cwd=gpu_check.REPO, capture_output=True, text=True, check=False)
    results.tensorrt = {"version": available, "export_s": round(time.monotonic() - started, 1)}
    if done.returncode != 0:
        results.tensorrt["failed"] = f"export: {done.stderr[-1000:]}"
        return None
    recipe = next(r for r in engines.recipes() if r.model == "classifier")
    plan_path = work / "classifier.plan"
    try:
        started = time.monotonic()
        engines.build(recipe, repository, plan_path, timing_cache=work / "timing.cache")
        results.tensorrt["build_s"] = round(time.monotonic() - started, 1)
        report = engines.parity(recipe, repository, plan_path)
        results.tensorrt["parity"] = {k: v for k, v in vars(report).items() if _plain(v)}
    except Exception as exc:  # noqa: BLE001 - recorded; the PyTorch paths still run
        results.tensorrt["failed"] = f"{type(exc).__name__}: {exc}"
        return None
    results.tensorrt["built"] = True
    classifier = ImageClassifier(device, engine=plan_path)
    pixels, _ = gpu_image.preprocess_batch(photos, device)
    sync = torch.cuda.synchronize
    speed = {}
    for size in plan.ceiling_batches:
        if time.monotonic() > deadline:
            break
        batch = pixels[np.arange(size) % len(photos)]
        speed[size] = round(
            gpu_check.timed(lambda b=batch: classifier.logits(b), size, plan.ceiling_seconds, sync),
            1,
        )
    results.tensorrt["engine_img_s"] = speed
    return plan_path


def _plain(value) -> bool:
    return isinstance(value, (int, float, str, bool))


# The run --------------------------------------------------------------------------------------
def phase_a(
    plan: Plan, results: Results, photos: list[bytes], device: str, deadline: float, weights
):
    """Phase A; returns (in-process top-1 per photo, CPU pipeline's top-1 per photo)."""
    import numpy as np
    import torch

    from pipelines.gpu_classifier import TorchImagePipeline

    results.host = host_facts()
    results.save()
    for name, step in (
        ("cold", lambda: cold_sizes(plan, device, weights)),
        ("ipc", lambda: ipc_costs(plan, device)),
        ("ceiling", lambda: ceilings(plan, photos, device, weights)),
    ):
        if time.monotonic() > deadline:
            results.notes.append(f"phase A: {name} skipped, its deadline passed")
            continue
        try:
            setattr(results, name, step())
        except Exception as exc:
            results.notes.append(f"phase A: {name} failed: {type(exc).__name__}: {exc}")
            log.exception("phase A: %s", name)
        results.save()
    pipeline = TorchImagePipeline({"weights": str(weights)} if weights else {}, device, 256)
    pixels, errors = pipeline.preprocess(photos)
    assert not any(errors), errors
    ids, _ = pipeline.top_k(pixels, np.arange(len(photos)), 1)
    del pipeline
    if device != "cpu":
        torch.cuda.empty_cache()
    return [int(i) for i in ids[:, 0]], top1_on_the_cpu(photos, weights)


def phase_b(plan, results, photos, expected, repository, out, start_of_run, bundle_dir):
    """One server with every variant: the levels in the plan's order, answers under load, text."""
    from server import Server

    config = gpu_check.server_config(
        plan.models(), cache_bytes=0, model_repository=repository,
        instances_per_gpu=plan.instances_per_gpu,
    )  # fmt: skip
    if plan.text and gpu_text_available():
        config.extra_args.append("--load-model=embed")
    start = time.monotonic()
    log_path = out / "server1.log"
    with Server(config, log_path=log_path) as server, gpu_check.Dmon(out / "dmon.txt") as dmon:
        results.stages_s["server1_start"] = round(time.monotonic() - start, 1)
        served = Served(plan, results, server, gpu_check.perf_input(photos, out), dmon)
        deadline = start_of_run + plan.levels_s
        for label, model, levels in plan.levels:
            for level in levels:
                if time.monotonic() > deadline:
                    results.notes.append(f"phase B: {label} c={level} skipped, deadline passed")
                    continue
                served.level(label, model, level)
            if label == plan.sampled_after and time.monotonic() < deadline:
                label5, model5, level5 = plan.sampled_level
                with GpuSampler(interval=0.2):
                    served.level(label5, model5, level5)
        deadline = start_of_run + plan.text_s
        for model in ANSWERS_CHECKED:
            if time.monotonic() > deadline:
                break
            try:
                results.answers[model] = served.answers_under_load(model, photos, expected)
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                results.notes.append(f"answers under load through {model}: {exc}")
            results.save()
        if plan.text and gpu_text_available() and time.monotonic() < deadline:
            results.text = measure_text(plan, server, out, deadline, bundle_dir)
            results.save()
    results.log_signs["server1"] = grep_log(log_path)
    results.save()


def phase_c(plan, results, photos, repository, out, deadline):
    """A second server with a 1 GiB CUDA pool and 512 MiB pinned: classify_bucket again (V6)."""
    from server import Server

    config = gpu_check.server_config(
        ("classify_bucket",), cache_bytes=0, model_repository=repository,
        instances_per_gpu=plan.instances_per_gpu,
    )  # fmt: skip
    config.extra_args += list(POOL_FLAGS)
    log_path = out / "server2.log"
    start = time.monotonic()
    with Server(config, log_path=log_path) as server, gpu_check.Dmon(out / "dmon.txt") as dmon:
        results.stages_s["server2_start"] = round(time.monotonic() - start, 1)
        served = Served(plan, results, server, gpu_check.perf_input(photos, out), dmon)
        for level in plan.pool_levels:
            if time.monotonic() < deadline:
                served.level("V6", "classify_bucket", level, server_name="server2")
    results.log_signs["server2"] = grep_log(log_path)
    results.save()


def gpu_text_available() -> bool:
    """Whether the text service's GPU measurement (tests/gpu_text.py) is in this checkout."""
    import importlib.util

    return importlib.util.find_spec("tests.gpu_text") is not None


def measure_text(plan: Plan, server, out: Path, deadline: float, bundle_dir: Path | None) -> dict:
    """The text service on the same GPU: served ``embed`` against the encoder in-process."""
    from tests import gpu_text

    device = gpu_check_device()
    text_plan = gpu_text.Plan.smoke() if plan.rehearsal else gpu_text.Plan()
    result = {"in_process": gpu_text.in_process(bundle_dir, device, text_plan)}
    result["served"] = gpu_text.served(server.grpc_url, server.http_url, out, text_plan, deadline)
    return result


def gpu_check_device() -> str:
    """cuda:0 where torch sees a GPU, else cpu."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def run(bundle_dir: Path | None, out: Path, plan: Plan) -> Results:
    """Every phase, each by its deadline; always writes what it has."""
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out)
    try:
        import model_config
        from export import samples
        from paths import MODEL_REPOSITORY

        model_config.render_repository(MODEL_REPOSITORY)
        device = gpu_check_device()
        if bundle_dir is not None:
            names = gpu_check._manifest(bundle_dir)["photos"]
            photos = [(bundle_dir / "photos" / f"{n}.jpg").read_bytes() for n in names]
        else:
            photos = [samples.photo_bytes(n) for n in samples.PHOTOS]
        t = time.monotonic()
        weights = gpu_check.classifier_weights(bundle_dir)
        in_process, on_cpu = phase_a(plan, results, photos, device, start + plan.phase_a_s, weights)
        results.answers["expected"] = {"in_process": in_process, "cpu_pipeline": on_cpu}
        results.stages_s["phase_a"] = round(time.monotonic() - t, 1)
        expected = {"in_process": in_process, "cpu_pipeline": on_cpu}
        t = time.monotonic()
        engine = tensorrt_phase(plan, results, photos, device, weights, start + plan.tensorrt_s)
        results.stages_s["tensorrt"] = round(time.monotonic() - t, 1)
        results.save()
        if engine is not None:
            plan = dataclasses.replace(
                plan, levels=(*plan.levels, ("V7", TENSORRT_VARIANT, (128,)))
            )
        with tempfile.TemporaryDirectory(prefix="gpu-diag-repository-") as tmp:
            configs = variant_configs(MODEL_REPOSITORY, engine)
            repository = gpu_check.write_repository(Path(tmp), configs, bundle_dir)
            if plan.text and gpu_text_available():
                from tests import gpu_text

                gpu_text.add_models(repository, MODEL_REPOSITORY, bundle_dir)
            t = time.monotonic()
            phase_b(plan, results, photos, expected, repository, out,
                    start, bundle_dir)  # fmt: skip
            results.stages_s["phase_b"] = round(time.monotonic() - t, 1)
            if time.monotonic() < start + plan.phase_c_after_s:
                t = time.monotonic()
                phase_c(plan, results, photos, repository, out, start + plan.budget_s)
                results.stages_s["phase_c"] = round(time.monotonic() - t, 1)
            else:
                results.notes.append("phase C skipped: too little time left")
    except Exception as exc:
        results.notes.append(f"failed: {type(exc).__name__}: {exc}")
        log.exception("gpu-diag failed")
    results.stages_s["total"] = round(time.monotonic() - start, 1)
    results.save()
    return results


# The report ---------------------------------------------------------------------------------
def markdown(r: Results) -> str:
    """The tables docs/gpu.md reads."""
    lines = _json_section(f"gpu-diag on {r.host.get('device', '?')}", r.host, "#")
    if r.cold:
        lines += [
            "## A1: first and second forward at new batch sizes (ms)",
            "",
            "| batch | first | second | cuDNN |",
            "|---|---|---|---|",
        ]
        for key, cudnn in (("sizes", "on"), ("without_cudnn", "off")):
            for size, t in r.cold.get(key, {}).items():
                lines.append(f"| {size} | {t['first_ms']} | {t['second_ms']} | {cudnn} |")
        lines.append("")
    if r.ipc:
        lines += _json_section("A2: CUDA IPC per call (µs)", r.ipc)
    if r.ceiling:
        columns = sorted({c for row in r.ceiling.values() for c in row})
        lines += [
            "## A3: in-process ceilings (img/s)",
            "",
            "| batch | " + " | ".join(columns) + " |",
        ]
        lines.append("|---" * (len(columns) + 1) + "|")
        for size, row in r.ceiling.items():
            lines.append(f"| {size} | " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
        lines.append("")
    if r.levels:
        lines += [
            "## B, C: served (gRPC, --async)", "",
            "| variant | model | c | img/s | p50 ms | p99 ms | avg batch per step"
            " | compute ms per step | GPU sm % | CPU share |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        for row in r.levels:
            batches = " / ".join(f"{s['avg_batch']}" for s in row["steps"].values())
            compute = " / ".join(f"{s['compute_ms']}" for s in row["steps"].values())
            cpu = ", ".join(f"{k}={v}" for k, v in row["cpu_share"].items())
            lines.append(
                f"| {row['label']} | {row['model']} | {row['concurrency']} | {row['throughput']} |"
                f" {row['p50_ms']} | {row['p99_ms']} | {batches} | {compute} |"
                f" {row['gpu'].get('sm', '')} | {cpu} |"
            )
        lines.append("")
    sections = (
        ("Answers under load", r.answers),
        ("Text service", r.text),
        ("TensorRT", r.tensorrt),
        ("Server log signs", r.log_signs),
        ("Stages (s)", r.stages_s),
    )
    for title, value in sections:
        if value:
            lines += _json_section(title, value)
    lines += [f"- {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


def _json_section(title: str, value, level: str = "##") -> list[str]:
    return [f"{level} {title}", "", "```", json.dumps(value, indent=1, default=str), "```", ""]


def main(argv: list[str] | None = None) -> int:
    """``run``; exit status 1 when the run failed or measured no served level."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(
        prog="python -m tests.gpu_diag", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    gpu_check.add_run_arguments(sub.add_parser("run", help="diagnose (GPU host; --smoke: CPU)"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu_check.smoke_environment(args.smoke)
    if args.bundle is not None and not args.prepared:
        return gpu_check.run_prepared("tests.gpu_diag", args)
    results = run(args.bundle, args.out, Plan.smoke() if args.smoke else Plan())
    print(markdown(results))
    failed = any(n.startswith("failed") for n in results.notes) or not results.levels
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
