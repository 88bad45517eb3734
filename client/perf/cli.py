"""``python -m client perf``: run the benchmark and write CSV, a markdown report and plots."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from client.perf import harness, report, variants

EXAMPLES = """
examples:
  python -m client perf                    # short run, about 5 minutes on 2 cores
  python -m client perf --full             # every model, protocol, variant and level
  python -m client perf --report-only results/perf-20261130-020000   # rebuild the report
"""


def add_parser(sub) -> None:
    """Register the ``perf`` subcommand."""
    p = sub.add_parser(
        "perf",
        help="perf_analyzer sweeps vs raw engine and a peer server; CSV, report, plots",
        description=(
            "Runs perf_analyzer against a real tritonserver (concurrency and Poisson request-rate "
            "sweeps, gRPC and HTTP, the ensemble and each step, with and without dynamic "
            "batching, 1 vs 2 instances), the raw onnxruntime engine in-process, and a "
            "FastAPI micro-batcher peer, interleaved over rounds with server and load generator "
            "pinned to different cores."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--full", action="store_true", help="run everything (tens of minutes)")
    p.add_argument("--rounds", type=int, help="override the number of interleaved rounds")
    p.add_argument("--out", type=Path, help="results folder (default results/perf-<time>)")
    p.add_argument("--server-cpus", help="cores for tritonserver and the raw engine, e.g. 1")
    p.add_argument("--client-cpus", help="cores for perf_analyzer, e.g. 0")
    p.add_argument("--report-only", type=Path, metavar="DIR", help="rebuild report from DIR")


def _cpus(text: str | None) -> list[int] | None:
    return [int(c) for c in text.split(",")] if text else None


def method(plan: harness.Plan, server_cpus, client_cpus, machine: dict) -> list[str]:
    """The method paragraph at the top of the report."""
    threads = len(server_cpus)
    return [
        f"Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}; "
        "tritonserver 2.51.0 (PyPI nvidia-pytriton), perf_analyzer from tritonclient 2.51.0.",
        f"Pinning: tritonserver, its Python-backend stubs, the raw engine and the peer server on "
        f"cores {server_cpus}; perf_analyzer on cores {client_cpus} (taskset).",
        f"Thread budget: onnxruntime uses {threads} intra-op thread(s) in the raw engine, in "
        "Triton's classifier and in the peer; the 2-instance variant splits it between instances.",
        f"Rounds: {plan.rounds}. Each round measures the raw engine, then every Triton variant "
        "(order rotated each round), then the peer and the null peer; ratios are taken within a "
        "round and reported as the median [min – max] over rounds.",
        f"perf_analyzer: one process per load level, measurement window {plan.measurement_ms} ms, "
        "stability 20 % over 3 windows, at most 6 trials; p50/p99 are client-side latencies. "
        "Request-rate sweeps use Poisson arrivals at fractions "
        f"{plan.rate_fractions} of the ensemble's saturated gRPC throughput in the same round.",
        "Inputs: the six scikit-image/scikit-learn sample photos as JPEG (ensemble, preprocess), "
        "their preprocessed pixels (classifier) and real logits (postprocess).",
        "Raw engine: the same model.onnx, the same preprocessing functions, in one process "
        "(`python -m client.perf.raw`), images/s per batch size.",
        "Peer: the same model.onnx behind FastAPI/uvicorn (uvloop, httptools, orjson) with an "
        "asyncio micro-batcher, driven by the same perf_analyzer with the same JSON payload "
        "(`--input-tensor-format json`); the null peer answers without running the model and "
        "measures the load generator's own ceiling.",
        "Variants (loaded with the model-control API, config overrides, no repository copy): "
        + "; ".join(f"**{v.name}**: {v.description}" for v in variants.standard(threads)),
    ]


def run(args: argparse.Namespace) -> int:
    """Run (or rebuild) the benchmark and print where the report is."""
    if args.report_only:
        out = args.report_only
    else:
        plan = harness.Plan.full() if args.full else harness.Plan.short()
        if args.rounds:
            plan.rounds = args.rounds
        cores = sorted(os.sched_getaffinity(0))
        server_cpus, client_cpus = harness.split_cores(cores)
        server_cpus = _cpus(args.server_cpus) or server_cpus
        client_cpus = _cpus(args.client_cpus) or client_cpus
        out = args.out or Path("results") / time.strftime("perf-%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        runner = harness.Runner(plan, out, server_cpus, client_cpus)
        print(f"perf: {plan.size() * plan.rounds} load levels in {plan.rounds} rounds -> {out}")
        runner.run()
        runner.write_csv()
        (out / "method.txt").write_text(
            "\n".join(method(plan, server_cpus, client_cpus, harness.machine())) + "\n"
        )
    rows, raw = report.load(out / "points.csv", out / "raw.csv")
    plots = report.write_plots(out, rows, raw)
    method_lines = (out / "method.txt").read_text().splitlines()
    path = report.write_markdown(out / "report.md", rows, raw, method_lines, plots)
    print(f"report: {path}")
    for item in report.metric_table(rows, raw):
        if item["values"]:
            met = {None: "", True: "  [met]", False: "  [NOT met]"}[item["met"]]
            print(f"  {item['metric'].name}: {item['median']:.3f}{met}")
    return 0
