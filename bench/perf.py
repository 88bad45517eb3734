"""`python -m bench perf` (``make perf``): the benchmark, its report and plots."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench import container, gateway, model, text_cache
from bench.harness import affinity, inputs, perf_analyzer, variants
from bench.harness.plan import (
    MIXED_WINDOW_REQUESTS,
    RATE_STABILITY_PERCENT,
    RATE_WINDOW_REQUESTS,
    Plan,
)
from bench.harness.runner import Runner
from bench.harness.servers import REFERENCE_BATCHES, REFERENCED, machine
from bench.peers import infinity
from bench.report import attribution
from bench.report.markdown import write_markdown
from bench.report.plots import write_plots
from bench.report.points import load
from bench.report.ratios import metric_table
from export import text_samples
from pipelines import embedding

EXAMPLES = """
examples:
  python -m bench perf                    # every ratio the targets name (durations: docs/)
  python -m bench perf --thorough         # and more levels, the other variants, every trace
  python -m bench perf --full             # every model, protocol, variant and level
  python -m bench perf --only embed-peers # embed, the FastAPI peer, infinity-emb: c=1/8/32
  python -m bench perf --only mixed       # the same three and the raw engine, mixed lengths
  python -m bench perf --only classify    # classify, traced step by step, and its raw pipeline
  python -m bench perf --only gateway     # the gateway's cost: nginx and OpenAI vs Triton
  python -m bench perf --only container   # the CPU image's cost: host network, -p, make serve
  python -m bench perf --model mynet      # a model you exported, against its raw graph
  python -m bench perf --report-only results/perf-20261130-020000   # rebuild the report
"""


def add_parser(sub) -> None:
    """Register the ``perf`` subcommand."""
    p = sub.add_parser(
        "perf",
        help="perf_analyzer sweeps vs raw engine and a peer server; CSV, report, plots",
        description=(
            "Runs perf_analyzer against a real tritonserver (concurrency and Poisson request-rate "
            "sweeps, gRPC and HTTP, the ensemble and each step, with and without dynamic "
            "batching, 1 vs 2 instances), the raw onnxruntime engine in-process, a FastAPI "
            "micro-batcher peer and infinity-emb (embeddings), interleaved over rounds with "
            "server and load generator pinned to different cores."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--thorough",
        action="store_true",
        help="the default's cases and the levels no target needs: classify at HTTP c=16, "
        "classifier, embed and embed_graph at c=1, the no-batching and 2-instance variants, "
        "a Poisson request-rate sweep, six traced cases, then the per-text cache "
        "(docs/performance.md: how long each run takes)",
    )
    which.add_argument(
        "--full", action="store_true", help="run everything (its length: docs/performance.md)"
    )
    which.add_argument(
        "--only",
        choices=("embed-peers", "mixed", "classify", "gateway", "container"),
        help="embed-peers: only embed, the FastAPI peer and infinity-emb at c=1/8/32; "
        "mixed: only their mixed-length rows (c=8/32) and the raw engine's; "
        "classify: only the image service, traced step by step, and its raw pipeline; "
        "gateway: only the gateway's cost (python -m bench.gateway); "
        "container: only the CPU image's cost (python -m bench.container)",
    )
    p.add_argument(
        "--infinity-venv",
        type=Path,
        help=f"use this environment with infinity-emb installed (default ${infinity.VENV_VARIABLE}"
        ", else .peers/infinity/venv, made on first use)",
    )
    which.add_argument(
        "--model",
        metavar="NAME",
        help="one model `python -m export torch` made, against its raw graph on the same cores "
        "(make perf MODEL=NAME; docs/your-model.md)",
    )
    p.add_argument(
        "--levels",
        default="1,8,32",
        help="concurrencies for --model, comma-separated (default 1,8,32)",
    )
    p.add_argument("--rounds", type=int, help="override the number of interleaved rounds")
    p.add_argument("--out", type=Path, help="results folder (default results/perf-<time>)")
    p.add_argument("--server-cpus", help="cores for tritonserver and the raw engine, e.g. 1")
    p.add_argument("--client-cpus", help="cores for perf_analyzer, e.g. 0")
    p.add_argument("--report-only", type=Path, metavar="DIR", help="rebuild report from DIR")


def method(plan: Plan, server_cpus, client_cpus, machine: dict) -> list[str]:
    """The method paragraph at the top of the report."""
    threads = len(server_cpus)
    shortest, longest = text_samples.MIXED_PASSAGE_WORDS
    return [
        f"Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}; "
        f"tritonserver {machine['tritonserver']}, perf_analyzer from tritonclient "
        f"{machine['tritonclient']}.",
        f"Pinning: tritonserver, its Python-backend stubs, the raw engine and the peer servers on "
        f"cores {server_cpus}; perf_analyzer on cores {client_cpus} (taskset).",
        f"Thread budget: onnxruntime uses {threads} intra-op thread(s) in the raw engine, in "
        "Triton's classifier and in the peer; the 2-instance variant splits it between instances.",
        f"Rounds: {plan.rounds}. Each round measures "
        + ("the raw engine, then " if plan.raw else "")
        + "every Triton variant (order rotated each round), then the peer and the null peer"
        + (", then infinity-emb and its null twin" if plan.infinity_levels else "")
        + "; ratios are taken within a round and reported as the median [min – max] over rounds"
        + (" (one round: no spread)." if plan.rounds == 1 else "."),
        f"perf_analyzer: one process per load level, measurement window {plan.measurement_ms} ms, "
        f"stability {plan.stability_percent:g} % over 3 windows, at most "
        f"{perf_analyzer.Run.max_trials} trials; p50/p99 are client-side latencies."
        + (
            " Request-rate sweeps use Poisson arrivals at fractions "
            f"{plan.rate_fractions} of the throughput that the concurrency sweep of the same "
            f"model and protocol reached in the same round, for {plan.rate_targets}; their "
            f"windows count at least {RATE_WINDOW_REQUESTS} requests and stabilize within "
            f"{RATE_STABILITY_PERCENT:g} % on throughput and average latency."
            if plan.rate_fractions and plan.rate_targets
            else ""
        ),
        "Inputs: the six scikit-image/scikit-learn sample photos as JPEG (ensemble, preprocess), "
        "their preprocessed pixels (classifier) and real logits (postprocess).",
        "Raw engine: the same model.onnx, the same preprocessing functions, in one process "
        "(`python -m bench.harness.raw`), images/s per batch size.",
        *(
            [
                f"Raw pipeline beside each case: every case of {', '.join(REFERENCED)} and of "
                "the pipeline peer runs between two readings of the raw pipeline at batch "
                f"{' and '.join(map(str, REFERENCE_BATCHES))}, from a long-lived process on "
                "the server's cores, and its ratios to the raw pipeline use their mean; of two "
                "such cases in a row, the reading after the first is the one before the second.",
            ]
            if plan.raw and any(m in REFERENCED for m, _, _ in plan.main)
            else []
        ),
        "Peer: the same model.onnx behind FastAPI/uvicorn (uvloop, httptools, orjson) with an "
        "asyncio micro-batcher, driven by the same perf_analyzer with the same JSON payload "
        "(`--input-tensor-format json`); the null peer answers without running the model and "
        "measures the load generator's own ceiling.",
        *(
            [
                f"infinity-emb {infinity.VERSION} (its own environment): the same MiniLM weights "
                f"(optimum's ONNX export of them), engine {infinity.ENGINE} (onnxruntime, CPU, "
                f"its default threads), pooling {infinity.POOLING}, max batch "
                f"{infinity.BATCH_SIZE}; driven by the same perf_analyzer with "
                "`--service-kind=openai --endpoint=embeddings` (OpenAI-style bodies of the same "
                "texts), which only has asynchronous calls, so embed and the FastAPI peer are "
                f"also measured with `--async` at concurrency {plan.infinity_levels}; a null "
                "server in infinity's response shape measures that client's ceiling. After "
                "each server is up, every thread of it and of its child processes is pinned "
                "again with `taskset -a -p` (onnxruntime may set its threads' affinity itself) "
                "and read back from /proc (below).",
            ]
            if plan.infinity_levels
            else []
        ),
        *(
            [
                f"Mixed lengths: {inputs.MIXED_TEXTS} distinct texts (seed {inputs.MIXED_SEED}, "
                "`export.text_samples.mixed_texts`: "
                f"{1 - text_samples.MIXED_PASSAGE_SHARE:.0%} single sentences, "
                f"{text_samples.MIXED_PASSAGE_SHARE:.0%} passages of "
                f"{shortest}-{longest} words; only those within {embedding.MAX_TOKENS} word "
                "pieces, which embed takes without TRUNCATE), one per request, at concurrency "
                f"{plan.mixed_levels} to embed (response cache off), the FastAPI peer and "
                "infinity-emb, with asynchronous calls, windows of at least "
                f"{MIXED_WINDOW_REQUESTS} requests (4x the concurrency where more) and "
                f"stability {RATE_STABILITY_PERCENT:g} %. Padded ÷ real tokens: embed's "
                "pipeline_padded_tokens_total ÷ pipeline_tokens_total (its /metrics, delta over "
                "the case), the peer's batcher counts (its /stats); infinity-emb does not "
                "expose them. The raw engine runs the same texts in batches of "
                f"{plan.raw_mixed_batches}: padded to each batch's longest text, and sorted "
                "into sub-batches (`pipelines.padding.encode_sorted`).",
            ]
            if plan.mixed_levels
            else []
        ),
        "Variants (each loaded into a fresh server with the model-control API and config "
        "overrides, no repository copy): "
        + "; ".join(
            f"**{v.name}**: {v.description}"
            for v in variants.standard(threads)
            if v.name == variants.SERVED or v.name in plan.others
        ),
    ]


def run(args: argparse.Namespace) -> int:
    """Run (or rebuild) the benchmark and print where the report is."""
    if args.model:
        return model.run(args.model, [int(c) for c in args.levels.split(",")])
    if args.only in ("gateway", "container"):
        alone = {"gateway": gateway.main, "container": container.main}[args.only]
        return alone(["--rounds", str(args.rounds)] if args.rounds else [])
    if args.report_only:
        out = args.report_only
    else:
        if args.only == "embed-peers":
            plan = Plan.embed_peers()
        elif args.only == "mixed":
            plan = Plan.mixed()
        elif args.only == "classify":
            plan = Plan.classify()
        elif args.full:
            plan = Plan.full()
        else:
            plan = Plan.thorough() if args.thorough else Plan.short()
        if args.rounds:
            plan.rounds = args.rounds
        server_cpus, client_cpus = affinity.chosen(args.server_cpus, args.client_cpus)
        out = args.out or Path("results") / time.strftime("perf-%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        runner = Runner(plan, out, server_cpus, client_cpus, infinity_venv=args.infinity_venv)
        print(f"perf: {plan.size() * plan.rounds} load levels in {plan.rounds} rounds -> {out}")
        runner.run()
        runner.write_csv()
        if plan.text_cache:
            print("text cache: Zipf traffic against the per-text and the response cache")
            text_cache.run(out, server_cpus, client_cpus)
        lines = method(plan, server_cpus, client_cpus, machine()) + runner.notes
        (out / "method.txt").write_text("\n".join(lines) + "\n")
    rows, raw = load(out / "points.csv", out / "raw.csv")
    plots = write_plots(out, rows, raw)
    found, problems = attribution.breakdowns(rows, out)
    steps = attribution.plot(out, rows, raw, found)
    plots += [steps] if steps else []
    method_lines = (out / "method.txt").read_text().splitlines()
    section = attribution.section(rows, raw, found, problems)
    cached = out / "text_cache.json"
    cache_result = json.loads(cached.read_text()) if cached.exists() else None
    if cache_result:
        section += text_cache.section(cache_result)
    path = write_markdown(out / "report.md", rows, raw, method_lines, plots, section)
    print(f"report: {path}")
    for item in metric_table(rows, raw):
        if item.get("why"):
            print(f"  {item['metric'].name}: n/a: {item['why']}")
        if item["values"]:
            met = {None: "", True: "  [met]", False: "  [NOT met]"}[item["met"]]
            if item.get("capped"):
                met = "  [capped by the load generator]"
            print(f"  {item['metric'].name}: {item['median']:.3f}{met}")
    for name, value, threshold, _ in text_cache.targets(cache_result) if cache_result else []:
        shown = "not measured" if value is None else value
        if isinstance(value, float):
            shown = f"{value:.3f}  [{'met' if value >= threshold else 'NOT met'}]"
        print(f"  {name}: {shown}")
    return 0
