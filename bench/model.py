"""One model of the repository against its own graph: ``make perf MODEL=<name>``.

For a model ``python -m export torch`` made (its signature.json says its inputs and their
ranges): a real tritonserver serves it alone from the repository's files, on the server's cores
with the variant this machine picks; perf_analyzer (gRPC, on the other cores) sends generated
inputs at each concurrency; the statistics extension says which batch sizes the batcher formed;
and the same ``model.onnx`` runs in-process on onnxruntime, pinned to the server's cores with
the thread count the config gives, at each of those batch sizes. The table gives served ÷ raw at
the batch size the server formed on average: what Triton costs on the same cores.

Example:
    python -m bench perf --model mynet --levels 1,8,32
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from bench.harness import affinity, perf_analyzer, raw, servers, stats
from export import model_files, tensor_specs
from paths import MODEL_REPOSITORY, REPO_ROOT
from server import Server, ServerConfig

log = logging.getLogger(__name__)

SAMPLES = 16  # distinct inputs perf_analyzer cycles through
RAW_SECONDS = 3.0


def input_specs(folder: Path) -> list[tensor_specs.InputSpec]:
    """The model's inputs as the export saw them: dims, ranges, generated values' bounds.

    Raises:
        SystemExit: the model has no signature.json (this benchmark is for generated models;
            ``make perf`` without MODEL measures the repository's own services).
    """
    if not (folder / model_files.SIGNATURE).is_file():
        raise SystemExit(
            f"{folder} has no {model_files.SIGNATURE}: MODEL= is for models that "
            "`python -m export torch` made (docs/your-model.md)"
        )
    signature, ranges, data = model_files.read_signature(folder)
    command = data.get("command", [])
    bounds = {}
    for text in (command[i + 1] for i, a in enumerate(command[:-1]) if a == "--input"):
        spec = tensor_specs.parse_input(text)
        bounds[spec.tensor.name] = spec.values
    return [
        tensor_specs.InputSpec(
            t, ranges.get(t.name, {}), bounds.get(t.name, tensor_specs.DEFAULT_VALUES)
        )
        for t in signature.inputs
    ]


def input_data(specs: list[tensor_specs.InputSpec], path: Path) -> Path:
    """perf_analyzer's ``--input-data`` JSON: SAMPLES generated items, dynamic axes at opt."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(SAMPLES):
        row = {}
        for spec in specs:
            array = spec.generate(rng, spec.shape(1, 1))[0]
            row[spec.tensor.name] = {"content": array.ravel().tolist(), "shape": list(array.shape)}
        rows.append(row)
    path.write_text(json.dumps({"data": rows}))
    return path


def raw_throughput(
    graph: Path, specs: list[tensor_specs.InputSpec], batches: list[int], threads: int
) -> dict[int, float]:
    """Items/s of the graph on onnxruntime in this process, per batch size."""
    from pipelines import onnx_runner

    session = onnx_runner.create_session(graph, intra_op_threads=threads)
    outputs = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(1)
    curve = {}
    for batch in batches:
        feeds = {s.tensor.name: s.generate(rng, s.shape(batch, 1)) for s in specs}
        curve[batch] = raw.throughput(
            lambda f=feeds: onnx_runner.run(session, f, outputs), batch, RAW_SECONDS
        )
    return curve


def _raw_in_child(name: str, batches: list[int], cpus: list[int], threads: int) -> dict[int, float]:
    """raw_throughput in a process pinned to ``cpus`` (the server's), as JSON back."""
    command = affinity.pinned(
        cpus,
        [sys.executable, "-m", "bench.model", "--raw", name, ",".join(map(str, batches)),
         str(threads)],
    )  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the raw run failed: {done.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}


def alone(name: str, target: Path) -> Path:
    """A repository holding only ``name``, its files linked (the server loads every model)."""
    source = MODEL_REPOSITORY / name
    for path in source.rglob("*"):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        link = target / name / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(path.resolve(), link)
    return target


def run(name: str, levels: list[int], measurement_ms: int = 3000) -> int:
    """Measure, print and save the table; 0 on success."""
    folder = MODEL_REPOSITORY / name
    specs = input_specs(folder)
    server_cpus, client_cpus = affinity.split()
    out = REPO_ROOT / "results" / f"perf-model-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = alone(name, Path(tmp) / "repository")
        data = input_data(specs, Path(tmp) / "inputs.json")
        config = ServerConfig(
            model_repository=repository,
            http_port=0,
            grpc_port=0,
            metrics_port=0,
            cpus=server_cpus,
        )
        with Server(config, log_path=out / "tritonserver.log") as server:
            client = httpclient.InferenceServerClient(server.http_url)
            served_config = client.get_model_config(name)
            threads = int(
                served_config.get("parameters", {})
                .get("intra_op_thread_count", {})
                .get("string_value", len(server_cpus))
            )
            # p99 over one window is noisy on a shared machine: throughput and p99 within 30 %.
            run_ = perf_analyzer.Run(name, server.grpc_url, input_data=data, cpus=client_cpus,
                          measurement_ms=measurement_ms, stability_percent=30.0)  # fmt: skip
            for level in levels:
                perf_analyzer.measure(run_, level)  # warm-up at this level, thrown away
                before = stats.snapshot(client, [name])
                point = perf_analyzer.measure(run_, level)
                moved = stats.delta(before, stats.snapshot(client, [name]))[name]
                rows.append((level, point, moved))
                log.info("c=%d %.1f /s p99 %.1f ms, batch %.1f", level, point.throughput,
                         point.p99_ms, moved.avg_batch)  # fmt: skip
            # An open keep-alive connection holds tritonserver's exit until its timeout.
            client.close()
    batches = sorted({max(1, round(m.avg_batch)) for _, _, m in rows})
    raw_rates = _raw_in_child(name, batches, server_cpus, threads)
    lines = [
        f"# {name}: served vs its raw graph ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Server on cores {server_cpus}, perf_analyzer (gRPC) on {client_cpus}; the raw graph "
        f"on onnxruntime with {threads} threads on the server's cores. "
        f"Machine: {json.dumps(servers.machine())}",
        "",
        "| c | served /s | p50 ms | p99 ms | formed batch (mean) | raw /s at that batch | "
        "served ÷ raw |",
        "|---|---|---|---|---|---|---|",
    ]
    for level, point, moved in rows:
        batch = max(1, round(moved.avg_batch))
        rate = raw_rates[batch]
        lines.append(
            f"| {level} | {point.throughput:.1f} | {point.p50_ms:.1f} | {point.p99_ms:.1f} | "
            f"{moved.avg_batch:.1f} | {rate:.1f} | {point.throughput / rate:.2f}x |"
        )
    report = "\n".join(lines) + "\n"
    (out / "report.md").write_text(report)
    (out / "raw.json").write_text(json.dumps(raw_rates))
    print(report)
    print(f"written to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``--raw NAME BATCHES THREADS``: the child that measures the raw graph (JSON out)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--raw"]:
        name, batches, threads = argv[1], argv[2], int(argv[3])
        specs = input_specs(MODEL_REPOSITORY / name)
        graph = MODEL_REPOSITORY / name / "1" / "model.onnx"
        curve = raw_throughput(graph, specs, [int(b) for b in batches.split(",")], threads)
        print(json.dumps(curve))
        return 0
    raise SystemExit("usage: python -m bench perf --model NAME")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sys.exit(main())
