"""The gateway's Prometheus metrics, counted from nginx's access log: their names, and the exporter.

nginx (rendered with ``--limits`` or a rollout, see ``gateway/nginx/``) writes one JSON line per
inference request to its access log (``gateway/nginx/parts/access_log.j2``): tenant, model,
protocol, ``$limit_req_status`` (``PASSED`` or ``REJECTED``), the HTTP status and a gRPC
answer's grpc-status, and the request's times.
Open-source nginx keeps no counters of its own for ``limit_req`` and no latency histograms, so
this exporter follows that file and serves, on ``/metrics`` (``gateway="nginx"``; names, labels
and buckets below): ``gateway_requests_total`` by outcome (admitted, refused by a bucket, or
failed: admitted and answered with a server error, a 5xx or ``GRPC_FAILED``; the availability
objectives read it, ``monitoring/slo.py``), and for the requests that were not refused
the histograms ``gateway_request_duration_seconds`` and ``gateway_upstream_duration_seconds`` by
tenant and model (what a tenant's own latency and the latency objectives are read from), and by
version during a rollout (``stable``, ``canary``: the two side by side).

    python -m gateway.access_log --log /var/log/nginx/shaping.log --port 9145

A rotated or truncated log is followed from its start; lines are counted once. What has been
counted is given back to the file system (a hole punched in the file, which nginx keeps
appending to), so the log takes at most about ``RELEASE_BYTES`` of disk however long it runs,
with no rotation and no line lost to one.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from gateway.nginx.rollout import CANARY, STABLE
from gateway.served import SERVED
from pipelines import embedding

__all__ = [
    "ADMITTED",
    "DURATION_BUCKETS",
    "DURATION_METRIC",
    "FAILED",
    "METRIC",
    "REFUSED",
    "UPSTREAM_METRIC",
    "AccessLogExporter",
    "AccessLogMetrics",
    "count_line",
]

# The counter of the gateway's inference requests: by gateway, tenant, model, protocol, outcome
# and version (a rollout's stable or canary; "", no label, without one).
METRIC = "gateway_requests"
METRIC_HELP = "Inference requests seen by the gateway's traffic shaping, by outcome."
LABELS = ("gateway", "tenant", "model", "protocol", "outcome", "version")
ADMITTED = "admitted"
REFUSED = "refused"
# Admitted, and answered with a server error (5xx: Triton's, or none answered the gateway).
FAILED = "failed"
# The gRPC statuses that are a server error, as gRPC maps them to HTTP (500, 503, 504), and
# RESOURCE_EXHAUSTED where no bucket refused: the gateway's connection limit, HTTP's 503.
# UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
GRPC_FAILED = frozenset({"2", "4", "8", "13", "14", "15"})
# Histograms of each admitted request's time, from the same log: nginx's $request_time (first
# byte read to last byte sent) and $upstream_response_time (the time Triton took, as nginx saw
# it), by tenant, model and version. The latency objectives (docker/prometheus/slos.yml) count
# requests under a bound, so every bound they name must be one of these buckets (monitoring
# checks it).
DURATION_METRIC = "gateway_request_duration_seconds"
DURATION_HELP = "Time of each admitted inference request at the gateway ($request_time)."
UPSTREAM_METRIC = "gateway_upstream_duration_seconds"
UPSTREAM_HELP = "Time Triton took for each admitted request, as nginx saw it."
DURATION_LABELS = ("gateway", "tenant", "model", "version")
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

log = logging.getLogger(__name__)

DEFAULT_PORT = 9145
# Counted lines beyond this many bytes are punched out of the file (Linux fallocate).
RELEASE_BYTES = 16 << 20
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE: offsets stay as they are
GATEWAY = "nginx"
# The model label: a served model, an OpenAI model id, or "" (not named, refused before it
# was read); anything else is "other", so that no client can add series by naming models.
MODELS = frozenset((*SERVED, *embedding.OPENAI_MODELS, ""))
OTHER = "other"
# A rollout's versions; "" (an empty label is no label to Prometheus) without a rollout.
VERSIONS = frozenset((STABLE, CANARY, ""))
# $limit_req_status → our outcome; DELAYED never happens with `nodelay`, and the dry-run
# statuses only with limit_req_dry_run, which the rendered config does not use.
# "" is a request of a gateway without token buckets (a rollout's log): nothing refused it.
OUTCOMES = {"PASSED": ADMITTED, "REJECTED": REFUSED, "": ADMITTED}


def release(fd: int, length: int) -> bool:
    """Free the disk blocks of the first ``length`` bytes of ``fd``; False where it cannot be.

    The file keeps its size and every later byte its offset: nginx appends on as before.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fallocate = getattr(libc, "fallocate", None)
    if fallocate is None:
        return False
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    return fallocate(fd, _PUNCH_HOLE, 0, length) == 0


def _first_data(fd: int, size: int) -> int:
    """Where the file's data starts after the stretches ``release`` gave back."""
    try:
        return os.lseek(fd, 0, os.SEEK_DATA)
    except OSError as exc:  # ENXIO: holes only; otherwise a file system that cannot tell
        return size if exc.errno == errno.ENXIO else 0


class AccessLogMetrics:
    """The exporter's series on ``registry``: the requests' counter and the two histograms."""

    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(METRIC, METRIC_HELP, LABELS, registry=registry)
        # The label sets (all but the outcome) whose every outcome's series exists.
        self.started: set[tuple[str, ...]] = set()
        self.duration, self.upstream = (
            Histogram(name, text, DURATION_LABELS, registry=registry, buckets=DURATION_BUCKETS)
            for name, text in ((DURATION_METRIC, DURATION_HELP), (UPSTREAM_METRIC, UPSTREAM_HELP))
        )


def seconds(value: str) -> float | None:
    """One of nginx's time variables in seconds, None where no server was reached.

    "0.004" is 0.004; "0.002, 0.003" (a second server tried) is their sum; "" or "-" is None.
    """
    parts = [p.strip() for p in value.split(",")]
    if not any(p and p != "-" for p in parts):
        return None
    return sum(float(p) for p in parts if p and p != "-")


def count_line(metrics: AccessLogMetrics, line: str) -> bool:
    """Count one line of the access log; False (and nothing counted) if it is not one.

    Lines of gateways rendered before the times were logged count without them.
    """
    try:
        entry = json.loads(line)
        outcome = OUTCOMES[entry["limit"]]
        if outcome == ADMITTED and (
            entry.get("status", "").startswith("5") or entry.get("grpc_status") in GRPC_FAILED
        ):
            outcome = FAILED
        model = entry["model"] if entry["model"] in MODELS else OTHER
        version = entry.get("version", "")
        version = version if version in VERSIONS else OTHER
        labels = (GATEWAY, entry["tenant"], model, entry["protocol"], outcome, version)
        took = seconds(entry.get("request_time", ""))
        upstream = seconds(entry.get("upstream_time", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    if (key := labels[:4] + labels[5:]) not in metrics.started:
        # Every outcome's series from a label set's first answer on, at 0: a first failure is
        # then an increase that rate() sees, and an error ratio is 0 rather than absent.
        for each in (ADMITTED, REFUSED, FAILED):
            metrics.requests.labels(*labels[:4], each, version)
        metrics.started.add(key)
    metrics.requests.labels(*labels).inc()
    if outcome != REFUSED:
        # Refusals take no time worth a latency objective: they are counted, not timed.
        timed = (*labels[:3], version)
        if took is not None:
            metrics.duration.labels(*timed).observe(took)
        if upstream is not None:
            metrics.upstream.labels(*timed).observe(upstream)
    return True


class AccessLogExporter:
    """Follows nginx's access log and counts every line; ``start()``/``stop()`` its thread.

    Args:
        path: the log file (it may not exist yet).
        registry: where the series live (a new one by default).
        interval: seconds between looks at the file.
        from_start: count what the file already holds (else only lines written later).
        release_bytes: once this many counted bytes are on disk, free them (``release``);
            0 never does (a file this process may not write).
    """

    def __init__(
        self,
        path: str | Path,
        registry: CollectorRegistry | None = None,
        interval: float = 0.2,
        from_start: bool = True,
        release_bytes: int = RELEASE_BYTES,
    ):
        self.release_bytes = release_bytes
        self._released = 0
        self.path = Path(path)
        self.registry = registry or CollectorRegistry()
        self.metrics = AccessLogMetrics(self.registry)
        self.interval = interval
        self.skipped = 0  # lines that were not access log entries
        self._offset: int | None = None if from_start else self._size()
        self._inode: int | None = None
        self._partial = b""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def poll(self) -> int:
        """Count the complete lines written since the last poll; returns how many."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return 0
        if self._inode != stat.st_ino or stat.st_size < (self._offset or 0):
            # A new file (rotated) or a truncated one: start over at its beginning. A first
            # look with from_start=False keeps the offset taken at creation.
            first = self._inode is None and self._offset is not None
            self._inode, self._partial = stat.st_ino, b""
            if not first:
                self._offset, self._released = 0, 0
        with self.path.open("rb") as f:
            if not self._offset:
                self._offset = _first_data(f.fileno(), stat.st_size)
            f.seek(self._offset)
            fresh = f.read()
            self._offset = f.tell()
        if not self._partial:
            # At a line's start: a released stretch reads as NULs up to the next line.
            fresh = fresh.lstrip(b"\0")
        data = self._partial + fresh
        *lines, self._partial = data.split(b"\n")
        counted = 0
        for line in lines:
            if count_line(self.metrics, line.decode("utf-8", "replace")):
                counted += 1
            elif line.strip():
                self.skipped += 1
        self._release(self._offset - len(self._partial))
        return counted

    def _release(self, counted_to: int) -> None:
        if not self.release_bytes or counted_to - self._released < self.release_bytes:
            return
        try:
            with self.path.open("r+b") as f:
                done = release(f.fileno(), counted_to)
        except OSError as exc:
            done = False
            log.warning("cannot give %s back to the disk: %s", self.path, exc)
        if done:
            self._released = counted_to
        else:  # a read-only file, or a file system without holes: the log just grows
            self.release_bytes = 0

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except OSError as exc:  # a file being rotated: try again at the next look
                log.warning("reading %s failed: %s", self.path, exc)

    def start(self) -> AccessLogExporter:
        """Follow the file in a background thread."""
        self.poll()
        self._thread = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following (after one last look at the file)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.poll()

    def __enter__(self) -> AccessLogExporter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gateway.access_log``: serve the requests' counts and times until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.access_log",
        description="Serve the counts and times of nginx's access log to Prometheus.",
        epilog="example: python -m gateway.access_log --log /var/log/nginx/shaping.log --port 9145",
    )
    parser.add_argument("--log", required=True, type=Path, help="nginx's access log")
    parser.add_argument("--host", default=os.environ.get("GATEWAY_METRICS_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default %(default)s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    exporter = AccessLogExporter(args.log).start()
    server, thread = start_http_server(args.port, args.host, registry=exporter.registry)
    log.info("counting %s, serving /metrics on %s:%d", args.log, args.host, args.port)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(timeout=5)
        exporter.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
