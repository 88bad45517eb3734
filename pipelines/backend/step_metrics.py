"""Custom Prometheus metrics of the Python steps, served by Triton on ``/metrics`` beside its own.

Each model instance creates its families once, in ``initialize``, through
``pb_utils.MetricFamily``. Instances of one model share every series: Triton's registry hands
out one series per name and label set and counts its users, so the numbers are per model and
version, labelled ``model`` and ``version`` as Triton's own ``nv_inference_*`` are. The models
record once per ``execute`` (one formed batch), not per item.

Only the metric objects live here; ``failure_reason`` is plain Python so tests can check it
without the stub.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Every series this project adds starts with this prefix (Triton's own start with nv_).
PREFIX = "pipeline_"
DECODE_FAILURES = PREFIX + "decode_failures_total"
PREPROCESS_SECONDS = PREFIX + "preprocess_seconds"
PREPROCESS_IMAGES = PREFIX + "preprocess_images_total"
TOKENS = PREFIX + "tokens_total"
PADDED_TOKENS = PREFIX + "padded_tokens_total"
TOKENS_PER_BATCH = PREFIX + "tokens_per_batch"
TRUNCATED_TEXTS = PREFIX + "truncated_texts_total"

# From one small image's decode + crop + resize (milliseconds) to a full batch of 32 large
# photos (seconds); measured times: docs/operations.md#custom-metrics.
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# A batch is up to 64 texts of up to 256 word pieces.
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

# The start of each error message of pipelines.image / pipelines.embedding (and of the adapters'
# own request-level checks) → the ``reason`` label. Prefixes, so the details may change.
_REASONS = (
    ("empty input", "empty"),
    ("empty text", "empty"),
    ("text has only whitespace", "blank"),
    ("not an image", "not_an_image"),
    ("not UTF-8", "not_utf8"),
    ("corrupt or truncated", "corrupt"),
    ("image too large", "too_large"),
    ("images too large", "too_large"),
    ("unsupported format", "unsupported"),
    ("corrupt EXIF", "corrupt"),
    ("cannot convert", "corrupt"),
    ("text too large", "too_large"),
    ("text too long", "too_long"),
    ("no texts", "no_input"),
    ("no images", "no_input"),
)
_ITEM_PREFIX = re.compile(r"^\w+\[\d+\]: ")  # "TEXT[3]: " as the adapters name an item


def failure_reason(error: Exception | str) -> str:
    """The ``reason`` label of one refused item: empty, not_an_image, corrupt, too_large, ...

    Args:
        error: the ImageError / TextError or its message, with or without a ``TEXT[i]:`` prefix.

    Returns:
        A short fixed label, ``other`` for a message no rule knows (kept small: each label
        value is its own series).
    """
    message = _ITEM_PREFIX.sub("", str(error))
    for start, reason in _REASONS:
        if message.startswith(start):
            return reason
    return "other"


class _Metrics:
    """Families and series of one model instance; ``close()`` them in ``finalize``."""

    def __init__(self, args: dict):
        import triton_python_backend_utils as pb_utils  # exists only inside the stub

        self._pb = pb_utils
        self._labels = {"model": args["model_name"], "version": args["model_version"]}
        self._families: list = []
        self.series: dict[str, object] = {}  # what the subclass records, by role
        self._failures: dict[str, object] = {}
        self._failure_family = self._family(
            DECODE_FAILURES, "Inputs refused as undecodable, by reason", "COUNTER"
        )

    def _family(self, name: str, description: str, kind: str):
        family = self._pb.MetricFamily(
            name=name, description=description, kind=getattr(self._pb.MetricFamily, kind)
        )
        self._families.append(family)
        return family

    def _series(self, family, buckets: Sequence[float] | None = None, **labels: str):
        labels = {**self._labels, **labels}
        if buckets is None:
            return family.Metric(labels=labels)
        return family.Metric(labels=labels, buckets=list(buckets))

    def failed(self, errors: Sequence[Exception | str | None]) -> None:
        """Count refused inputs (None entries are successes and are skipped)."""
        counts: dict[str, int] = {}
        for error in errors:
            if error is not None:
                reason = failure_reason(error)
                counts[reason] = counts.get(reason, 0) + 1
        for reason, n in counts.items():
            if reason not in self._failures:
                # Made on first use: a reason that never happens adds no series.
                self._failures[reason] = self._series(self._failure_family, reason=reason)
            self._failures[reason].increment(n)

    def close(self) -> None:
        """Drop the series before their families, as Triton requires."""
        self.series.clear()
        self._failures.clear()
        self._failure_family = None
        self._families.clear()


class PreprocessMetrics(_Metrics):
    """preprocess: decode failures by reason, seconds per batch, images seen."""

    def __init__(self, args: dict):
        super().__init__(args)
        self.series["seconds"] = self._series(
            self._family(
                PREPROCESS_SECONDS,
                "Seconds one preprocess execute spent decoding and resizing its batch",
                "HISTOGRAM",
            ),
            buckets=SECONDS_BUCKETS,
        )
        self.series["images"] = self._series(
            self._family(PREPROCESS_IMAGES, "Images preprocess was given, bad ones too", "COUNTER")
        )

    def batch(self, seconds: float, errors: Sequence[Exception | None]) -> None:
        """Record one execute: its duration and each image's outcome (None: decoded)."""
        if not errors:
            return  # every request of the batch was empty or cancelled
        self.series["seconds"].observe(seconds)
        self.series["images"].increment(len(errors))
        self.failed(errors)


class TokenizeMetrics(_Metrics):
    """tokenize: refused texts by reason, real and padded token positions, truncations."""

    def __init__(self, args: dict):
        super().__init__(args)
        self.series["tokens"] = self._series(
            self._family(
                TOKENS, "Word pieces of the texts tokenized, [CLS]/[SEP] included", "COUNTER"
            )
        )
        self.series["padded"] = self._series(
            self._family(
                PADDED_TOKENS,
                "Token positions sent to the encoder after padding each request to its bucket",
                "COUNTER",
            )
        )
        self.series["per_batch"] = self._series(
            self._family(
                TOKENS_PER_BATCH, "Word pieces per tokenize execute (one formed batch)", "HISTOGRAM"
            ),
            buckets=TOKEN_BUCKETS,
        )
        self.series["truncated"] = self._series(
            self._family(TRUNCATED_TEXTS, "Texts cut at the encoder's 256 word pieces", "COUNTER")
        )

    def batch(self, tokens: int, padded: int, truncated: int) -> None:
        """Record one execute: real word pieces, positions after padding, truncated texts."""
        if tokens == 0:
            return  # every request of the batch was refused or cancelled
        self.series["tokens"].increment(tokens)
        self.series["padded"].increment(padded)
        self.series["per_batch"].observe(tokens)
        if truncated:
            self.series["truncated"].increment(truncated)


TEXT_CACHE_HITS = PREFIX + "text_cache_hits_total"
TEXT_CACHE_MISSES = PREFIX + "text_cache_misses_total"
TEXT_CACHE_ERRORS = PREFIX + "text_cache_errors_total"
TEXT_CACHE_CORRUPT = PREFIX + "text_cache_corrupt_total"
TEXT_CACHE_REDIS_SECONDS = PREFIX + "text_cache_redis_seconds"
TEXT_CACHE_BREAKER_OPEN = PREFIX + "text_cache_breaker_open"
# One MGET or pipelined SET on loopback takes well under a millisecond; the timeout is a few.
REDIS_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1)
CACHE_LAYERS = ("local", "redis")
# pipelines.text_cache.error_kind's labels: a fixed few (each label value is its own series).
ERROR_KINDS = ("connection", "timeout", "auth", "full", "breaker_open", "other")


class TextCacheMetrics(_Metrics):
    """The per-text cache of an embedding step: hits per layer, misses, Redis calls and health.

    Recorded once per formed batch (each update is a round trip to tritonserver).
    """

    def __init__(self, args: dict):
        super().__init__(args)
        hits = self._family(TEXT_CACHE_HITS, "Texts answered from the per-text cache", "COUNTER")
        for layer in CACHE_LAYERS:
            self.series[layer] = self._series(hits, layer=layer)
        self.series["misses"] = self._series(
            self._family(TEXT_CACHE_MISSES, "Texts no cache layer had: encoded", "COUNTER")
        )
        self.series["corrupt"] = self._series(
            self._family(
                TEXT_CACHE_CORRUPT, "Cached values that did not decode (recomputed)", "COUNTER"
            )
        )
        self.series["seconds"] = self._series(
            self._family(
                TEXT_CACHE_REDIS_SECONDS,
                "Seconds of each Redis round trip (MGET, or the pipelined SETs)",
                "HISTOGRAM",
            ),
            buckets=REDIS_BUCKETS,
        )
        self.series["open"] = self._series(
            self._family(
                TEXT_CACHE_BREAKER_OPEN,
                "1 while the breaker keeps calls from a failing Redis, else 0",
                "GAUGE",
            )
        )
        errors = self._family(
            TEXT_CACHE_ERRORS,
            "Redis calls that failed, by kind (the texts were encoded)",
            "COUNTER",
        )
        # Every kind from the start, at 0: a rate over them is defined before the first failure.
        self._errors = {kind: self._series(errors, kind=kind) for kind in ERROR_KINDS}
        self._open: bool | None = None

    def record(self, outcomes, breaker_open: bool | None) -> None:
        """Count what one formed batch's lookup and store did; note the breaker's state."""
        totals = {"local": 0, "redis": 0, "misses": 0, "corrupt": 0}
        errors: dict[str, int] = {}
        for outcome in outcomes:
            totals["local"] += outcome.local_hits
            totals["redis"] += outcome.shared_hits
            totals["misses"] += outcome.misses
            totals["corrupt"] += outcome.corrupt
            for kind, n in outcome.errors.items():
                errors[kind] = errors.get(kind, 0) + n
            for seconds in outcome.redis_seconds:
                self.series["seconds"].observe(seconds)
        for name, n in totals.items():
            if n:
                self.series[name].increment(n)
        for kind, n in errors.items():
            self._errors[kind].increment(n)
        if breaker_open is not None and breaker_open != self._open:
            self.series["open"].set(1 if breaker_open else 0)
            self._open = breaker_open

    def close(self) -> None:
        """Drop the error series too."""
        self._errors.clear()
        super().close()
