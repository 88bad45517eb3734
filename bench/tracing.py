"""What OpenTelemetry tracing costs: the same load with tracing off, at the default rate, and at 1.

``python -m bench.tracing`` measures three servers of ``make serve``'s configs, one after the
other and interleaved over rounds, each held to the same cores, perf_analyzer on the other core:

* ``off``: as ``make serve`` runs by default;
* ``rate 1000``: ``--trace-url`` with Triton's default sampling (one request in 1000);
* ``rate 1``: every request traced, the server's spans and the Python steps' own.

All three export to an OTLP receiver in this process (``monitoring.traces``), which counts the
spans, so a run that traced nothing is seen. ``embed`` (one short text per request) over gRPC,
the response cache and the per-text cache off; the table gives each one's rate and p99 per round
and the median rate over ``off``'s::

    .venv/bin/python -m bench.tracing --rounds 2 --levels 8
"""

from __future__ import annotations

import logging
import sys

from bench import container
from bench.harness import affinity, compare
from monitoring import traces
from pipelines import embedding
from server import tracing

log = logging.getLogger(__name__)

SYSTEMS = {"off": None, "rate 1000": tracing.DEFAULT_RATE, "rate 1": 1}
MODELS = (embedding.ENSEMBLE,)


def main(argv: list[str] | None = None) -> int:
    """Print the table of the three servers and the ratios, and the spans received."""
    args = compare.arguments(
        argv, __doc__, "python -m bench.tracing --rounds 2 --levels 8", (2, "8", 4000)
    )
    server_cpus, load_cpus = affinity.split()
    log.info("servers on cores %s, perf_analyzer on %s", server_cpus, load_cpus)
    with traces.Receiver() as receiver:
        systems = {
            name: container.computed_path_system(
                server_cpus,
                trace=None if rate is None else tracing.TraceSettings(receiver.url, rate=rate),
            )
            for name, rate in SYSTEMS.items()
        }
        points = compare.interleaved(
            systems, MODELS, args.levels, args.rounds, args.measurement_ms, load_cpus
        )
        spans = receiver.spans()
    print()
    print(compare.table(points, list(SYSTEMS), MODELS, args.levels))
    print(f"\nspans received: {len(spans)} in {len({s.trace_id for s in spans})} traces")
    return 0


if __name__ == "__main__":
    sys.exit(main())
