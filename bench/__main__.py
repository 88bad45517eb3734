"""Benchmarks of the served models, on top of everything else in the repository.

Examples:
    python -m bench perf                      # perf_analyzer vs raw engine and peers (make perf)
    python -m bench.overload --service embed  # load shedding at 4x capacity
    python -m bench.contention                # two models sharing one core
    python -m tests.gpu_check run --smoke --out results/gpu-smoke   # the GPU check, on a CPU
"""

from __future__ import annotations

import argparse
import sys

from bench import perf


def main(argv: list[str] | None = None) -> int:
    """``perf``: the benchmark ``make perf`` runs."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    perf.add_parser(sub)
    return perf.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
