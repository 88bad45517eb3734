"""`python -m bench perf` (benchmark, report, plots) and `python -m bench tune` (SLO tuner)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench import (
    attribution,
    harness,
    infinity,
    inputs,
    report,
    text_cache,
    tune,
    tune_session,
    variants,
)

EXAMPLES = """
examples:
  python -m bench perf                    # short run (durations: docs/performance.md)
  python -m bench perf --full             # every model, protocol, variant and level
  python -m bench perf --only embed-peers # embed, the FastAPI peer, infinity-emb: c=1/8/32
  python -m bench perf --only mixed       # the same three and the raw engine, mixed lengths
  python -m bench perf --only classify    # classify, traced step by step, and its raw pipeline
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
    p.add_argument(
        "--full", action="store_true", help="run everything (its length: docs/performance.md)"
    )
    p.add_argument(
        "--only",
        choices=("embed-peers", "mixed", "classify"),
        help="embed-peers: only embed, the FastAPI peer and infinity-emb at c=1/8/32; "
        "mixed: only their mixed-length rows (c=8/32) and the raw engine's; "
        "classify: only the image service, traced step by step, and its raw pipeline",
    )
    p.add_argument(
        "--infinity-venv",
        type=Path,
        help=f"use this environment with infinity-emb installed (default ${infinity.VENV_VARIABLE}"
        ", else .peers/infinity/venv, made on first use)",
    )
    p.add_argument("--rounds", type=int, help="override the number of interleaved rounds")
    p.add_argument("--out", type=Path, help="results folder (default results/perf-<time>)")
    p.add_argument("--server-cpus", help="cores for tritonserver and the raw engine, e.g. 1")
    p.add_argument("--client-cpus", help="cores for perf_analyzer, e.g. 0")
    p.add_argument("--report-only", type=Path, metavar="DIR", help="rebuild report from DIR")


def _cpus(text: str | None) -> list[int] | None:
    return [int(c) for c in text.split(",")] if text else None


def cores(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """(server cores, load-generator cores): from the options, else split what we may use."""
    server_cpus, client_cpus = harness.split_cores(sorted(os.sched_getaffinity(0)))
    return _cpus(args.server_cpus) or server_cpus, _cpus(args.client_cpus) or client_cpus


def method(plan: harness.Plan, server_cpus, client_cpus, machine: dict) -> list[str]:
    """The method paragraph at the top of the report."""
    threads = len(server_cpus)
    return [
        f"Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}; "
        "tritonserver 2.51.0 (PyPI nvidia-pytriton), perf_analyzer from tritonclient 2.51.0.",
        f"Pinning: tritonserver, its Python-backend stubs, the raw engine and the peer servers on "
        f"cores {server_cpus}; perf_analyzer on cores {client_cpus} (taskset).",
        f"Thread budget: onnxruntime uses {threads} intra-op thread(s) in the raw engine, in "
        "Triton's classifier and in the peer; the 2-instance variant splits it between instances.",
        f"Rounds: {plan.rounds}. Each round measures "
        + ("the raw engine, then " if plan.raw else "")
        + "every Triton variant (order rotated each round), then the peer and the null peer"
        + (", then infinity-emb and its null twin" if plan.infinity_levels else "")
        + "; ratios are taken within a round and reported as the median [min – max] over rounds.",
        f"perf_analyzer: one process per load level, measurement window {plan.measurement_ms} ms, "
        "stability 20 % over 3 windows, at most 6 trials; p50/p99 are client-side latencies. "
        "Request-rate sweeps use Poisson arrivals at fractions "
        f"{plan.rate_fractions} of the throughput that the concurrency sweep of the same model "
        f"and protocol reached in the same round, for {plan.rate_targets}; their windows "
        f"count at least {harness.RATE_WINDOW_REQUESTS} requests and stabilize within "
        f"{harness.RATE_STABILITY_PERCENT:g} % on throughput and average latency.",
        "Inputs: the six scikit-image/scikit-learn sample photos as JPEG (ensemble, preprocess), "
        "their preprocessed pixels (classifier) and real logits (postprocess).",
        "Raw engine: the same model.onnx, the same preprocessing functions, in one process "
        "(`python -m bench.raw`), images/s per batch size.",
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
                "`export.text_samples.mixed_texts`: 70 % single sentences, 30 % passages of "
                "80-250 words), one per request, at concurrency "
                f"{plan.mixed_levels} to embed (response cache off), the FastAPI peer and "
                "infinity-emb, with asynchronous calls, windows of at least "
                f"{harness.MIXED_WINDOW_REQUESTS} requests (4x the concurrency where more) and "
                f"stability {harness.RATE_STABILITY_PERCENT:g} %. Padded ÷ real tokens: embed's "
                "pipeline_padded_tokens_total ÷ pipeline_tokens_total (its /metrics, delta over "
                "the case), the peer's batcher counts (its /stats); infinity-emb does not "
                "expose them. The raw engine runs the same texts in batches of "
                f"{plan.raw_mixed_batches}: padded to each batch's longest text, and sorted "
                "into sub-batches (`pipelines.embedding.encode_sorted`).",
            ]
            if plan.mixed_levels
            else []
        ),
        "Variants (each loaded into a fresh server with the model-control API and config "
        "overrides, no repository copy): "
        + "; ".join(f"**{v.name}**: {v.description}" for v in variants.standard(threads)),
    ]


def run(args: argparse.Namespace) -> int:
    """Run (or rebuild) the benchmark and print where the report is."""
    if args.report_only:
        out = args.report_only
    else:
        if args.only == "embed-peers":
            plan = harness.Plan.embed_peers()
        elif args.only == "mixed":
            plan = harness.Plan.mixed()
        elif args.only == "classify":
            plan = harness.Plan.classify()
        else:
            plan = harness.Plan.full() if args.full else harness.Plan.short()
        if args.rounds:
            plan.rounds = args.rounds
        server_cpus, client_cpus = cores(args)
        out = args.out or Path("results") / time.strftime("perf-%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        runner = harness.Runner(
            plan, out, server_cpus, client_cpus, infinity_venv=args.infinity_venv
        )
        print(f"perf: {plan.size() * plan.rounds} load levels in {plan.rounds} rounds -> {out}")
        runner.run()
        runner.write_csv()
        if plan.text_cache:
            print("text cache: Zipf traffic against the per-text and the response cache")
            text_cache.run(out, server_cpus, client_cpus)
        lines = method(plan, server_cpus, client_cpus, harness.machine()) + runner.notes
        (out / "method.txt").write_text("\n".join(lines) + "\n")
    rows, raw = report.load(out / "points.csv", out / "raw.csv")
    plots = report.write_plots(out, rows, raw)
    found, problems = attribution.breakdowns(rows, out)
    steps = attribution.plot(out, rows, raw, found)
    plots += [steps] if steps else []
    method_lines = (out / "method.txt").read_text().splitlines()
    section = attribution.section(rows, raw, found, problems)
    cached = out / "text_cache.json"
    cache_result = json.loads(cached.read_text()) if cached.exists() else None
    if cache_result:
        section += text_cache.section(cache_result)
    path = report.write_markdown(out / "report.md", rows, raw, method_lines, plots, section)
    print(f"report: {path}")
    for item in report.metric_table(rows, raw):
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


TUNE_EXAMPLES = """
examples:
  python -m bench tune classify --p99-ms 100 --budget-s 300
  python -m bench tune classify --p99-ms 100 --brute-force   # also verify every candidate
  python -m bench tune shared --p99-ms 100   # classifier and encoder on one server, at once
  python -m bench tune classifier --p99-ms 60   # one model: Triton Model Analyzer's search
then serve with:  python -m server --model-config-name local-tuned
"""


def add_tune_parser(sub) -> None:
    """Register the ``tune`` subcommand."""
    p = sub.add_parser(
        "tune",
        help="find the config with the most throughput within a p99 target; write it",
        description=tune.__doc__,
        epilog=TUNE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", choices=tune.TARGETS)
    p.add_argument("--p99-ms", type=float, required=True, help="latency SLO (client-side p99)")
    p.add_argument("--budget-s", type=float, default=300, help="time budget for verification")
    p.add_argument(
        "--config-name", default="local-tuned", help="write configs/<name>.overlay.pbtxt"
    )
    p.add_argument("--brute-force", action="store_true", help="also verify every candidate")
    p.add_argument("--out", type=Path, help="results folder (default results/tune-<time>)")
    p.add_argument("--server-cpus")
    p.add_argument("--client-cpus")


def tune_run(args: argparse.Namespace) -> int:
    """Measure raw curves, rank candidates, verify within the budget, write the winner."""
    started = time.monotonic()
    server_cpus, client_cpus = cores(args)
    out = args.out or Path("results") / time.strftime("tune-%Y%m%d-%H%M%S")
    try:
        session = tune_session.Session(
            args.model, args.p99_ms, out, server_cpus, client_cpus, args.config_name
        )
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    if args.brute_force and args.model == tune.SHARED:
        print("error: --brute-force verifies one model's or ensemble's space, not a shared server")
        return 2
    if tune_session.SEARCH[args.model] == tune_session.MODEL_ANALYZER:
        if args.brute_force:
            print("error: --brute-force checks bench tune's own search; Model Analyzer tunes this")
            return 2
        return tune_session.with_model_analyzer(session, started, args.budget_s)
    ranked = session.ranked()
    space = session.space()
    with session:
        remaining = args.budget_s - (time.monotonic() - started)
        print(f"verifying with perf_analyzer, {remaining:.0f} s of budget left")
        results = session.search(ranked, remaining)
        brute, rematch = None, None
        if args.brute_force:
            print(f"brute force: verifying all {len(space)} candidates")
            brute = tune.verify_all(space, session.load, session.measure, args.p99_ms)
            ours, theirs = tune.best(results), tune.best(brute)
            if ours and theirs and ours.candidate != theirs.candidate:
                print("rematch: both winners again, alternately")
                rematch = tune.head_to_head(
                    ours.candidate, theirs.candidate, session.load, session.measure, args.p99_ms
                )
        winner = tune.best(results)
        if winner is not None:
            # What it measured stays in tune.json (and docs/performance.md), not in the config.
            header = (
                f"Written by `python -m bench tune {args.model} --p99-ms {args.p99_ms}` "
                f"(perf_analyzer gRPC, server on {session.cores} core(s)); what it measured: "
                f"{out / 'tune.json'}."
            )
            for path in session.write(winner.candidate, header):
                print(tune.describe(path))
    outcome = tune.summary(results, brute, rematch)
    outcome["total_seconds"] = time.monotonic() - started
    (out / "tune.json").write_text(json.dumps(outcome, indent=2))
    rows = [("tuner", r) for r in results] + [("brute force", r) for r in brute or []]
    notes = [
        f"`python -m bench tune {args.model} --p99-ms {args.p99_ms} --budget-s {args.budget_s:g}`:"
        f" {len(results)} of {len(space)} candidates verified, "
        f"{outcome['total_seconds']:.0f} s in all."
    ]
    report = tune_session.write_report(out, f"SLO tuner: {args.model}", rows, args.p99_ms, notes)
    if winner is None:
        print(f"no candidate met p99 <= {args.p99_ms} ms; nothing written")
        return 1
    print(
        f"best: {tune.label(winner.candidate)} -> {winner.throughput:.1f}/s, "
        f"p99 {winner.p99_ms:.1f}"
    )
    if outcome.get("rematch_tuner_vs_brute_force"):
        print(f"rematch, tuner / brute force: {outcome['rematch_tuner_vs_brute_force']:.3f}")
    if "tuner_vs_brute_force" in outcome:
        print(
            f"tuner / brute force: {outcome['tuner_vs_brute_force']:.3f} "
            f"({outcome['tuner_seconds']:.0f} s vs {outcome['brute_force_seconds']:.0f} s)"
        )
    print(f"report: {report}; details: {out / 'tune.json'}")
    return 0
