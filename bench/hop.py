"""What one Python-backend step costs: identity models in chains of 1 to 3, and shm settings.

``python -m bench.hop`` starts tritonserver over a throw-away repository of identity models (a
Python model that returns its input), pinned to one core with perf_analyzer on the other, and
measures at concurrency 1 the p50 latency of:

* ``identity`` alone (a small tensor: FP32 [1, 16]), over gRPC and HTTP;
* ensembles of 1, 2 and 3 identity steps: the slope is what each extra step adds;
* the same chains with a large tensor (FP32 [1, 3, 224, 224], an image's pixels), under the
  Python backend's default shared memory and under larger ``shm-default-byte-size`` /
  ``shm-growth-byte-size`` (``--backend-config=python,...``).

Example: ``python -m bench.hop --json results/hop.json``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench import perf_analyzer
from server import Server, ServerConfig

IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", data)]))
        return responses
"""
SHAPES = {"small": [16], "image": [3, 224, 224]}
# (label, Python backend settings): its defaults, then regions that never need to grow.
SHM_SETTINGS = {
    "default": {},
    "64MiB": {"shm-default-byte-size": 64 << 20, "shm-growth-byte-size": 16 << 20},
}
CHAIN = (1, 2, 3)


def _io(name: str, dims: list[int]) -> str:
    return f'{{ name: "{name}", data_type: TYPE_FP32, dims: [ {", ".join(map(str, dims))} ] }}'


def write_repository(root: Path) -> Path:
    """identity_<shape> models and chain_<shape>_<n> ensembles of n of them."""
    for shape, dims in SHAPES.items():
        model = root / f"identity_{shape}"
        (model / "1").mkdir(parents=True)
        (model / "1" / "model.py").write_text(IDENTITY_MODEL)
        (model / "config.pbtxt").write_text(
            f'name: "identity_{shape}"\nbackend: "python"\nmax_batch_size: 8\n'
            f"input [ {_io('INPUT', dims)} ]\noutput [ {_io('OUTPUT', dims)} ]\n"
            "instance_group [ { kind: KIND_CPU, count: 1 } ]\n"
        )
        for n in CHAIN:
            steps = []
            for i in range(n):
                source = "INPUT" if i == 0 else f"t{i}"
                target = "OUTPUT" if i == n - 1 else f"t{i + 1}"
                steps.append(
                    f'{{ model_name: "identity_{shape}", model_version: -1, '
                    f'input_map {{ key: "INPUT", value: "{source}" }}, '
                    f'output_map {{ key: "OUTPUT", value: "{target}" }} }}'
                )
            chain = root / f"chain_{shape}_{n}"
            (chain / "1").mkdir(parents=True)
            (chain / "config.pbtxt").write_text(
                f'name: "chain_{shape}_{n}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
                f"input [ {_io('INPUT', dims)} ]\noutput [ {_io('OUTPUT', dims)} ]\n"
                f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
            )
    return root


def p50(url: str, protocol: str, model: str, cpus: list[int] | None) -> float:
    """Client-side p50 latency (ms) at concurrency 1, over 300-request windows."""
    run = perf_analyzer.Run(
        model,
        url,
        protocol,
        cpus=cpus,
        measurement_ms=1000,
        stability_percent=20,
        extra=["--measurement-mode=count_windows", "--measurement-request-count=300"],
    )
    return perf_analyzer.measure(run, 1, timeout=180).p50_ms


def measure(settings: dict[str, int], server_cpus, client_cpus) -> dict:
    """Every chain and protocol under one set of Python-backend settings."""
    extra = [f"--backend-config=python,{k}={v}" for k, v in settings.items()]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        repository = write_repository(Path(tmp))
        config = ServerConfig(
            model_repository=repository,
            http_port=0,
            grpc_port=0,
            metrics_port=0,
            model_config_name=None,
            cpus=server_cpus,
            cache_bytes=0,
            extra_args=extra,
        )
        with Server(config) as server:
            urls = {"grpc": server.grpc_url, "http": server.http_url}
            for shape in SHAPES:
                for protocol, url in urls.items():
                    row = {"identity": p50(url, protocol, f"identity_{shape}", client_cpus)}
                    for n in CHAIN:
                        row[f"chain_{n}"] = p50(url, protocol, f"chain_{shape}_{n}", client_cpus)
                    # Least squares over the chains: the latency each step adds.
                    xs = list(CHAIN)
                    ys = [row[f"chain_{n}"] for n in xs]
                    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
                    row["per_step"] = sum(
                        (x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)
                    ) / sum((x - mean_x) ** 2 for x in xs)
                    results[f"{shape}/{protocol}"] = row
    return results


def main(argv: list[str] | None = None) -> int:
    """Measure and print; ``--json`` also writes the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpus = (cores[1:2], cores[:1]) if len(cores) > 1 else (None, None)
    report = {}
    for label, settings in SHM_SETTINGS.items():
        report[label] = measure(settings, server_cpus, client_cpus)
        for key, row in report[label].items():
            cells = "  ".join(f"{k} {v:6.2f}" for k, v in row.items())
            print(f"shm {label:8s} {key:12s} p50 ms: {cells}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
