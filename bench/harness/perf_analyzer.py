"""Run Triton's ``perf_analyzer`` (shipped in the tritonclient 2.51 wheel) and read its CSV.

The wheel's binary links ``libb64.so.0d`` and ``libcudart.so.12``; the nvidia-pytriton wheel
carries both under hashed names, so we point symlinks with the expected names at those copies.
Run as a program, this module is perf_analyzer itself with those libraries found: every
argument goes to it unchanged (``bench/perf_analyzer`` runs it so, for people at a shell).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import affinity

log = logging.getLogger(__name__)

LIBRARIES = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}
# How often a running level asks its ``watch`` whether the server can still be measured.
WATCH_EVERY_S = 2.0


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer failed; the message carries its output."""


def find_binary() -> Path:
    """perf_analyzer next to this interpreter (the venv), else on PATH (the NGC SDK image)."""
    local = Path(sys.executable).parent / "perf_analyzer"
    if local.exists():
        return local
    found = shutil.which("perf_analyzer")
    if not found:
        raise FileNotFoundError(
            "perf_analyzer not found: pip install tritonclient[http,grpc]==2.51.0"
        )
    return Path(found)


def library_dir() -> Path | None:
    """A folder of symlinks that satisfies perf_analyzer's two missing libraries, or None."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        return None
    libs = Path(spec.origin).parent.parent / "nvidia_pytriton.libs"
    target = Path(sys.prefix) / "lib" / "perf_analyzer_libs"
    target.mkdir(parents=True, exist_ok=True)
    for name, pattern in LIBRARIES.items():
        matches = sorted(libs.glob(pattern))
        link = target / name
        if not matches or link.exists():
            continue
        # A link left dangling by a reinstall (new hashed names) is replaced; another process
        # making the same link at the same moment is as good as this one making it.
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        with contextlib.suppress(FileExistsError):
            link.symlink_to(matches[0])
    return target


def environment() -> dict[str, str]:
    """Environment in which perf_analyzer finds its libraries."""
    env = dict(os.environ)
    extra = library_dir()
    if extra:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(extra), env.get("LD_LIBRARY_PATH", "")) if p
        )
    return env


@dataclass
class Run:
    """One perf_analyzer invocation: a model, a protocol, and a sweep of load levels."""

    model: str
    url: str
    protocol: str = "grpc"  # or "http"
    mode: str = "concurrency"  # or "rate" (Poisson arrivals at fixed request rates)
    levels: Sequence[float] = (1,)
    input_data: Path | None = None
    measurement_ms: int = 2000
    stability_percent: float = 20.0
    max_trials: int = 6
    tensor_format: str = "binary"  # HTTP only: "json" sends the same JSON payload as a peer
    cpus: Sequence[int] | None = None  # pin the load generator (taskset)
    extra: list[str] = field(default_factory=list)

    def command(self, csv_path: Path, level: float) -> list[str]:
        """The command line for one load level.

        One level per process, so that a level that fails to stabilize costs only itself.
        """
        cmd = [
            str(find_binary()),
            "-m",
            self.model,
            "-u",
            self.url,
            "-i",
            self.protocol,
            "-f",
            str(csv_path),
            "--verbose-csv",
            f"--measurement-interval={self.measurement_ms}",
            f"--stability-percentage={self.stability_percent}",
            f"--max-trials={self.max_trials}",
        ]
        if self.mode == "concurrency":
            n = int(level)
            cmd += ["--percentile=99", f"--concurrency-range={n}:{n}:1"]
        elif self.mode == "rate":
            # Poisson arrivals make p99 over one window too noisy to stabilize on: the average
            # latency and the throughput decide (the CSV still has every percentile).
            cmd += [f"--request-rate-range={level}:{level}:1", "--request-distribution=poisson"]
        else:
            raise ValueError(f"mode must be concurrency or rate, got {self.mode!r}")
        if self.input_data:
            # Absolute: perf_analyzer runs in a scratch directory.
            cmd += [f"--input-data={Path(self.input_data).resolve()}"]
        if self.protocol == "http" and self.tensor_format == "json":
            cmd += ["--input-tensor-format=json", "--output-tensor-format=json"]
        cmd += list(self.extra)
        if self.cpus:
            cmd = affinity.pinned(self.cpus, cmd)
        return cmd


@dataclass(frozen=True)
class Point:
    """One measured load level, latencies in milliseconds."""

    level: float
    throughput: float  # inferences per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float
    server_queue_ms: float
    server_compute_ms: float


# Point's fields in milliseconds: all but its level and throughput.
LATENCIES = tuple(f.name for f in dataclasses.fields(Point)[2:])


def parse_csv(text: str) -> list[Point]:
    """Points from perf_analyzer's ``-f`` CSV (``--verbose-csv``; microseconds in, ms out)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    points = []
    for row in rows:
        level_key = "Concurrency" if "Concurrency" in row else "Request Rate"
        us = {k: float(v) for k, v in row.items() if k and v not in (None, "")}
        compute = sum(
            us.get(k, 0.0)
            for k in ("Server Compute Input", "Server Compute Infer", "Server Compute Output")
        )
        client_avg = sum(
            us.get(k, 0.0)
            for k in (
                "Client Send",
                "Network+Server Send/Recv",
                "Server Queue",
                "Server Compute Input",
                "Server Compute Infer",
                "Server Compute Output",
                "Client Recv",
            )
        )
        points.append(
            Point(
                level=us[level_key],
                throughput=us["Inferences/Second"],
                p50_ms=us["p50 latency"] / 1000,
                p90_ms=us["p90 latency"] / 1000,
                p95_ms=us["p95 latency"] / 1000,
                p99_ms=us["p99 latency"] / 1000,
                avg_ms=client_avg / 1000,
                server_queue_ms=us.get("Server Queue", 0.0) / 1000,
                server_compute_ms=compute / 1000,
            )
        )
    return points


def measure(
    run: Run,
    level: float,
    timeout: float = 300.0,
    retries: int = 1,
    watch: Callable[[], str | None] | None = None,
) -> Point:
    """Run one load level and return its point.

    A level that does not stabilize (p99 over a short window is noisy on a busy 2-core machine)
    is retried with a window twice as long and a looser stability bound.

    Args:
        run: what to measure.
        level: the concurrency or request rate.
        timeout: seconds before perf_analyzer is given up on.
        retries: tries left after an unstable one.
        watch: asked every ``WATCH_EVERY_S`` while perf_analyzer runs; a reason (the server
            died, or stopped answering) ends the level at once: a hung server then costs its
            watch's own timeout rather than ``timeout``.

    Raises:
        PerfAnalyzerError: perf_analyzer failed every try, or ``watch`` gave a reason; its
            output or that reason attached.
    """
    try:
        return _measure_once(run, level, timeout, watch)
    except PerfAnalyzerError as exc:
        if retries <= 0 or "stable measurement" not in str(exc):
            raise
        log.info("level %s did not stabilize; retrying with a longer window", level)
    looser = dataclasses.replace(
        run,
        measurement_ms=run.measurement_ms * 2,
        stability_percent=run.stability_percent * 1.5,
        max_trials=run.max_trials + 2,
    )
    return measure(looser, level, timeout, retries - 1, watch)


def _run_watched(
    cmd: list[str], cwd: str, timeout: float, watch: Callable[[], str | None] | None
) -> tuple[int, str]:
    """perf_analyzer's exit status and output; raises once ``timeout`` or ``watch`` ends it."""
    deadline = time.monotonic() + timeout
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment(),
        cwd=cwd,
    ) as process:  # fmt: skip
        while True:
            left = deadline - time.monotonic()
            try:
                output, _ = process.communicate(timeout=max(min(WATCH_EVERY_S, left), 0.01))
                return process.returncode, output
            except subprocess.TimeoutExpired:
                # A server that stops answering must cost one level, not the whole run.
                trouble = watch() if watch is not None else None
                if trouble is None and time.monotonic() < deadline:
                    continue
                process.kill()
                process.communicate()
                if trouble is not None:
                    raise PerfAnalyzerError(f"perf_analyzer stopped: {trouble}") from None
                raise PerfAnalyzerError(
                    f"perf_analyzer hung: no result after {timeout:.0f} s"
                ) from None


def _measure_once(
    run: Run, level: float, timeout: float, watch: Callable[[], str | None] | None
) -> Point:
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "out.csv"
        cmd = run.command(csv_path, level)
        log.debug("%s", " ".join(cmd))
        returncode, output = _run_watched(cmd, tmp, timeout, watch)
        if returncode != 0 or not csv_path.exists():
            lines = output.splitlines()
            # The cause is the first line for argument errors and the last ones otherwise.
            shown = lines if len(lines) <= 12 else [*lines[:3], "...", *lines[-8:]]
            message = "\n".join(shown)
            raise PerfAnalyzerError(f"perf_analyzer failed ({returncode}): {message}")
        points = parse_csv(csv_path.read_text())
    if len(points) != 1:
        raise PerfAnalyzerError(f"expected one CSV row, got {len(points)}")
    return points[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Become perf_analyzer with ``argv`` as its arguments, its libraries found.

    Returns:
        1 if there is no perf_analyzer to run; otherwise this process is perf_analyzer and
        never returns.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        binary = find_binary()
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    os.execve(binary, [str(binary), *args], environment())


if __name__ == "__main__":
    sys.exit(main())
