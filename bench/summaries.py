"""What Triton's latency summaries cost: the same load with ``summary_latencies`` on and off.

``python -m bench.summaries`` measures two servers of ``make serve``'s configs, one after the
other and interleaved over rounds, each held to the same cores, perf_analyzer on the other core:

* ``on``: as served (``ServerConfig.summary_latencies``: p50, p90 and p99 of every model's
  request, queue and compute time);
* ``off``: the same server without them.

``embed`` (one text per request) and ``classify`` (one JPEG) over gRPC at saturation, with the
response cache and embed's per-text cache off (perf_analyzer repeats its inputs). The table
gives each one's rate and p99 per round and the median rate of ``off`` over ``on``::

    .venv/bin/python -m bench.summaries --rounds 2 --levels 16
"""

from __future__ import annotations

import logging
import sys

from bench import container
from bench.harness import affinity, compare

log = logging.getLogger(__name__)

SYSTEMS = ("on", "off")


def main(argv: list[str] | None = None) -> int:
    """Print the table of both servers and the ratios."""
    args = compare.arguments(
        argv, __doc__, "python -m bench.summaries --rounds 2 --levels 16", (2, "16", 4000)
    )
    levels = args.levels
    server_cpus, load_cpus = affinity.split()
    log.info("servers on cores %s, perf_analyzer on %s", server_cpus, load_cpus)
    systems = {
        name: container.computed_path_system(server_cpus, summary_latencies=name == "on")
        for name in SYSTEMS
    }
    points = compare.interleaved(
        systems, container.MODELS, levels, args.rounds, args.measurement_ms, load_cpus
    )
    print()
    print(compare.table(points, SYSTEMS, container.MODELS, levels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
