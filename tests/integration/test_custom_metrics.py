"""The Python steps' own metrics (pipelines/backend/step_metrics.py) on the server's /metrics page.

Each test reads the page before and after a few sequential requests and checks the exact change,
computing the expected token counts in-process with the same tokenizer.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pipelines import classification, embedding, padding, tokenization
from pipelines.backend import step_metrics
from tests.bad_images import bad_images
from tests.helpers import change, scrape

pytestmark = pytest.mark.integration


def bucket_changes(before: dict, after: dict, histogram: str, **labels: str) -> dict[float, float]:
    """How much each bucket of one histogram series grew: upper bound (le) → change."""
    les = {
        dict(key[1])["le"]
        for key in after
        if key[0] == histogram + "_bucket" and frozenset(labels.items()) <= key[1]
    }
    return {float(le): change(before, after, histogram + "_bucket", **labels, le=le) for le in les}


def send(
    server, protocol: str, model: str, name: str, items: list[bytes], truncate: bool = False
) -> str | None:
    """One request with these BYTES items; its error message, or None on success.

    ``truncate``: a text step's TRUNCATE flag set for every item.
    """
    mod = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with mod.InferenceServerClient(url) as client:
        tensor = mod.InferInput(name, [len(items), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(items, dtype=np.object_).reshape(-1, 1))
        tensors = [tensor]
        if truncate:
            tensors.append(mod.InferInput(embedding.TRUNCATE, [len(items), 1], "BOOL"))
            tensors[-1].set_data_from_numpy(np.ones((len(items), 1), dtype=bool))
        try:
            client.infer(model, tensors)
        except InferenceServerException as exc:
            return exc.message()
    return None


PRE = {"model": classification.PREPROCESS, "version": "1"}
# embed's text step on the local configs: tokenize_encode pads each sub-batch to its longest text.
TOK = {"model": embedding.TOKENIZE_ENCODE, "version": "1"}


def test_failure_reasons_cover_every_message_the_steps_produce(photos):
    from pipelines import image

    reasons = {
        "pixel-bomb": "too_large",
        "truncated": "corrupt",
        "corrupt-exif": "corrupt",
        "tiff": "unsupported",
        "not-an-image": "not_an_image",
    }
    cases = {b"": "empty"} | {
        data: reasons[name] for name, (data, _) in bad_images(photos["chelsea"]).items()
    }
    for data, reason in cases.items():
        with pytest.raises(image.ImageError) as failure:
            image.decode(data)
        assert step_metrics.failure_reason(failure.value) == reason
    for data, reason in {b"": "empty", b"caf\xe9": "not_utf8", b"  ": "blank"}.items():
        with pytest.raises(tokenization.TextError) as failure:
            tokenization.decode_text(data)
        assert step_metrics.failure_reason(f"TEXT[2]: {failure.value}") == reason
    assert step_metrics.failure_reason("image too large: 9000x9000 exceeds 64000000 pixels") == (
        "too_large"
    )
    assert step_metrics.failure_reason("images too large: IMAGE holds 2 pixels") == "too_large"
    assert step_metrics.failure_reason("something new") == "other"


def test_preprocess_counts_decode_failures_by_reason_and_times_each_batch(server, photos):
    before = scrape(server)
    truncated = photos["coffee"][:1500]
    # Sequential requests: one execute each. gRPC and HTTP alike feed the same series.
    assert (
        send(server, "http", classification.ENSEMBLE, classification.IMAGE, [photos["chelsea"]])
        is None
    )
    assert "not an image" in send(
        server, "http", classification.ENSEMBLE, classification.IMAGE, [b"GIF? no"]
    )
    assert "not an image" in send(
        server, "grpc", classification.ENSEMBLE, classification.IMAGE, [b"no image"]
    )
    assert "truncated" in send(
        server, "grpc", classification.ENSEMBLE, classification.IMAGE, [truncated]
    )
    # One request of three images, two of them bad: both are counted, one execute.
    error = send(
        server,
        "http",
        classification.ENSEMBLE,
        classification.IMAGE,
        [photos["flower"], b"", truncated],
    )
    assert "IMAGE[1]: empty input" in error
    after = scrape(server)

    failures = step_metrics.DECODE_FAILURES
    assert change(before, after, failures, **PRE, reason="not_an_image") == 2
    assert change(before, after, failures, **PRE, reason="corrupt") == 2
    assert change(before, after, failures, **PRE, reason="empty") == 1
    assert change(before, after, step_metrics.PREPROCESS_IMAGES, **PRE) == 7
    seconds = step_metrics.PREPROCESS_SECONDS
    assert change(before, after, seconds + "_count", **PRE) == 5
    assert 0 < change(before, after, seconds + "_sum", **PRE) < 30
    timed = bucket_changes(before, after, seconds, **PRE)
    assert set(timed) == {*step_metrics.SECONDS_BUCKETS, math.inf}, sorted(timed)
    counts = [timed[le] for le in sorted(timed)]
    assert counts == sorted(counts), timed  # cumulative
    # Each execute decodes at most three photos, in milliseconds: all five are under 5 s
    # (seconds counted as milliseconds, or an execute observed twice, would not be).
    assert timed[5.0] == timed[math.inf] == 5, timed
    # Triton's own per-model series are on the same page. They cannot replace the counter above:
    # the step counts refused requests as successes, and 2.51 counts each failed ensemble request
    # twice under reason="OTHER" (seen here); they are also recorded as requests are released,
    # so they may trail the response: hence ">=" on the one good request sent first.
    assert (("nv_inference_count", frozenset(PRE.items()))) in after
    assert change(before, after, "nv_inference_count", **PRE) >= 1


def unseen(text: str) -> str:
    # The embed ensemble has a response cache: a text sent before would not reach its step. The
    # tag keeps these texts apart from every other test's, and fixed (no random part) so that
    # their word pieces, hence the expected counts, are the same in every run.
    return f"{text} [custom-metrics padding check]"


def test_the_text_step_counts_real_and_padded_tokens_per_batch(server):
    requests = [
        [unseen("A man is eating food."), unseen("A longer sentence about a man riding a horse.")],
        [unseen("word " * 400)],  # over 256 word pieces: cut, as its request asks
        [unseen("Short.")],
    ]
    ids = [tokenization.encode(texts)[0] for texts in requests]
    expected_tokens = sum(len(t) for request in ids for t in request)
    # Sequential requests, one execute each. Worked out here rather than by asking
    # padding.sub_batches, the code under test: two texts share one run when the longer
    # is at most RUN_COST_TOKENS word pieces longer (one run costs that much), and a run pads
    # each text to its longest; one text alone is never padded.
    short, long = sorted(len(t) for t in ids[0])
    assert short < long <= short + padding.RUN_COST_TOKENS, (short, long)
    expected_padded = 2 * long + len(ids[1][0]) + len(ids[2][0])
    assert expected_tokens < expected_padded  # the short text of the first request is padded

    before = scrape(server)
    for i, texts in enumerate(requests):
        protocol = "http" if i % 2 == 0 else "grpc"
        items = [t.encode() for t in texts]
        assert send(server, protocol, embedding.ENSEMBLE, embedding.TEXT, items, True) is None
    assert "not UTF-8" in send(server, "http", embedding.ENSEMBLE, embedding.TEXT, [b"caf\xe9"])
    over = [unseen("word " * 401).encode()]  # refused: no TRUNCATE
    assert "text too long" in send(server, "http", embedding.ENSEMBLE, embedding.TEXT, over)
    assert "text too large" in send(
        server, "grpc", embedding.ENSEMBLE, embedding.TEXT, [b"x" * (300 * 1024)]
    )
    after = scrape(server)

    assert change(before, after, step_metrics.TOKENS, **TOK) == expected_tokens
    assert change(before, after, step_metrics.PADDED_TOKENS, **TOK) == expected_padded
    assert change(before, after, step_metrics.TRUNCATED_TEXTS, **TOK) == 1
    per_batch = step_metrics.TOKENS_PER_BATCH
    assert change(before, after, per_batch + "_count", **TOK) == len(requests)
    assert change(before, after, per_batch + "_sum", **TOK) == expected_tokens
    # Sequential requests: one execute each, observed with its own word-piece count (about 20,
    # 256 and 4 here: three different buckets).
    per_request = [sum(len(t) for t in request) for request in ids]
    expected_buckets = {
        le: sum(n <= le for n in per_request) for le in (*step_metrics.TOKEN_BUCKETS, math.inf)
    }
    assert len({min(le for le in expected_buckets if n <= le) for n in per_request}) == 3
    assert bucket_changes(before, after, per_batch, **TOK) == expected_buckets
    failures = step_metrics.DECODE_FAILURES
    assert change(before, after, failures, **TOK, reason="not_utf8") == 1
    assert change(before, after, failures, **TOK, reason="too_large") == 1
    assert change(before, after, failures, **TOK, reason="too_long") == 1
    assert change(before, after, "nv_inference_count", **TOK) >= 1  # Triton's own, same page
