"""The SLO tuner: the config with the most throughput within a p99 target (``make tune``).

It measures the raw engine's curves, ranks every candidate config by a model of them, verifies
the best with perf_analyzer against a real tritonserver within a time budget, and writes the
winner as ``configs/<name>.overlay.pbtxt``; single models go to Triton Model Analyzer's search
(``tune.session.SEARCH``). How it decides: tune/search.py; its figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.harness import affinity
from tune import search, session

TUNE_EXAMPLES = """
examples:
  python -m tune classify --p99-ms 100 --budget-s 300
  python -m tune classify --p99-ms 100 --brute-force   # also verify every candidate
  python -m tune shared --p99-ms 100   # classifier and encoder on one server, at once
  python -m tune classifier --p99-ms 60   # one model: Triton Model Analyzer's search
then serve with:  python -m server --model-config-name local-tuned
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The tuner's options."""
    p.add_argument("model", choices=search.TARGETS)
    p.add_argument("--p99-ms", type=float, required=True, help="latency SLO (client-side p99)")
    p.add_argument("--budget-s", type=float, default=300, help="time budget for verification")
    p.add_argument(
        "--config-name", default="local-tuned", help="write configs/<name>.overlay.pbtxt"
    )
    p.add_argument("--brute-force", action="store_true", help="also verify every candidate")
    p.add_argument("--out", type=Path, help="results folder (default results/tune-<time>)")
    p.add_argument("--server-cpus")
    p.add_argument("--client-cpus")


def run(args: argparse.Namespace) -> int:
    """Measure raw curves, rank candidates, verify within the budget, write the winner."""
    started = time.monotonic()
    server_cpus, client_cpus = affinity.chosen(args.server_cpus, args.client_cpus)
    out = args.out or Path("results") / time.strftime("tune-%Y%m%d-%H%M%S")
    try:
        tuner = session.Session(
            args.model, args.p99_ms, out, server_cpus, client_cpus, args.config_name
        )
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    if args.brute_force and args.model == search.SHARED:
        print("error: --brute-force verifies one model's or ensemble's space, not a shared server")
        return 2
    if session.SEARCH[args.model] == session.MODEL_ANALYZER:
        if args.brute_force:
            print("error: --brute-force checks the tuner's own search; Model Analyzer tunes this")
            return 2
        return session.with_model_analyzer(tuner, started, args.budget_s)
    ranked = tuner.ranked()
    space = tuner.space()
    with tuner:
        remaining = args.budget_s - (time.monotonic() - started)
        print(f"verifying with perf_analyzer, {remaining:.0f} s of budget left")
        results = tuner.search(ranked, remaining)
        brute, rematch = None, None
        if args.brute_force:
            print(f"brute force: verifying all {len(space)} candidates")
            brute = search.verify_all(space, tuner.load, tuner.measure, args.p99_ms)
            ours, theirs = search.best(results), search.best(brute)
            if ours and theirs and ours.candidate != theirs.candidate:
                print("rematch: both winners again, alternately")
                rematch = search.head_to_head(
                    ours.candidate, theirs.candidate, tuner.load, tuner.measure, args.p99_ms
                )
        winner = search.best(results)
        if winner is not None:
            # What it measured stays in tune.json (and docs/performance.md), not in the config.
            header = (
                f"Written by `python -m tune {args.model} --p99-ms {args.p99_ms}` "
                f"(perf_analyzer gRPC, server on {tuner.cores} core(s)); what it measured: "
                f"{out / 'tune.json'}."
            )
            for path in tuner.write(winner.candidate, header):
                print(search.describe(path))
    outcome = search.summary(results, brute, rematch)
    outcome["total_seconds"] = time.monotonic() - started
    (out / "tune.json").write_text(json.dumps(outcome, indent=2))
    rows = [("tuner", r) for r in results] + [("brute force", r) for r in brute or []]
    notes = [
        f"`python -m tune {args.model} --p99-ms {args.p99_ms} --budget-s {args.budget_s:g}`:"
        f" {len(results)} of {len(space)} candidates verified, "
        f"{outcome['total_seconds']:.0f} s in all."
    ]
    report = session.write_report(out, f"SLO tuner: {args.model}", rows, args.p99_ms, notes)
    if winner is None:
        print(f"no candidate met p99 <= {args.p99_ms} ms; nothing written")
        return 1
    print(
        f"best: {search.label(winner.candidate)} -> {winner.throughput:.1f}/s, "
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


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and tune."""
    parser = argparse.ArgumentParser(
        prog="python -m tune",
        description=search.__doc__,
        epilog=TUNE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
