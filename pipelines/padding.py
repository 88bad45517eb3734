"""Token batches: padded to length buckets, cut into length-sorted sub-batches, mean-pooled.

How the encoder's input is shaped (docs/models.md, "One step on the CPU" and "Padding waste"), and
the pooling that makes its token embeddings one vector per text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pipelines import embedding, tokenization

PAD_ID = 0
# Each request is padded only to the bucket of its own longest text, not to the longest text
# of everything queued: short texts never pay for a long neighbour's padding, and requests in
# the same bucket share a shape, so the encoder's dynamic batcher can still join them.
BUCKETS = (16, 32, 64, 128, embedding.MAX_TOKENS)


def bucket_length(longest: int) -> int:
    """The padded length for a request whose longest text has ``longest`` tokens."""
    return next(b for b in BUCKETS if b >= longest)


def pad(
    token_ids: Sequence[Sequence[int]], length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Pad to ``length`` (default: the bucket of the longest) → (ids, mask), int64 [n, length]."""
    length = length or bucket_length(max(len(t) for t in token_ids))
    ids = np.full((len(token_ids), length), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(token_ids), length), dtype=np.int64)
    for row, tokens in enumerate(token_ids):
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    return ids, mask


# Padded token positions per encoder run of tokenize_encode (its config's max_batch_tokens):
# room for 64 short texts or 8 truncated passages in one run.
MAX_BATCH_TOKENS = 2048
# What one more encoder run costs beyond its tokens, in token positions: the value that gave
# the most texts/s over mixed texts on one core (docs/studies/2026-12-01-sub-batch-run-cost.md). A
# sub-batch is cut where padding to the next text would cost more than that.
RUN_COST_TOKENS = 16


def sub_batches(
    lengths: Sequence[int],
    max_tokens: int = MAX_BATCH_TOKENS,
    run_cost: int = RUN_COST_TOKENS,
) -> list[list[int]]:
    """Indices of texts, sorted by length and cut into the cheapest runs of the encoder.

    A run is padded to its own longest text and costs ``run_cost + len(run) * longest`` token
    positions; the cuts minimize the sum over runs (exactly, by dynamic programming over the
    sorted lengths), so texts of similar length share a run and a passage never pads a batch
    of short sentences. No run holds more than ``max_tokens`` positions, unless it is one text.

    Args:
        lengths: token count of each text.
        max_tokens: padded positions one run may hold.
        run_cost: the fixed cost of one run, in token positions.

    Returns:
        Lists of indices into ``lengths``, shortest texts first; together each index once.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sorted_lengths = [lengths[i] for i in order]
    # best[j]: the cheapest cost of the first j sorted texts; start[j]: where its last run starts.
    best, start = [0] + [0] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        longest = sorted_lengths[j - 1]
        best[j] = best[j - 1] + run_cost + longest
        start[j] = j - 1
        for i in range(j - 2, -1, -1):
            size = (j - i) * longest
            if size > max_tokens:
                break
            if best[i] + run_cost + size < best[j]:
                best[j], start[j] = best[i] + run_cost + size, i
    runs, j = [], len(order)
    while j > 0:
        runs.append(order[start[j] : j])
        j = start[j]
    return runs[::-1]


def encode_sorted(
    encoder: Callable[[np.ndarray, np.ndarray], np.ndarray],
    token_ids: Sequence[Sequence[int]],
    max_tokens: int = MAX_BATCH_TOKENS,
    run_cost: int = RUN_COST_TOKENS,
) -> tuple[np.ndarray, int]:
    """Embeddings of tokenized texts, in their order, from one encoder run per sub-batch.

    Args:
        encoder: (ids, mask) int64 [n, L] → float32 [n, width] (the encoder's graph).
        token_ids: each text's word-piece ids.
        max_tokens: padded positions per run (``sub_batches``).
        run_cost: the fixed cost of one run, in token positions (``sub_batches``).

    Returns:
        (float32 [len(token_ids), width], the padded positions the runs processed).
    """
    lengths = [len(t) for t in token_ids]
    out: np.ndarray | None = None  # its width is the encoder's (MiniLM's 384, or another's)
    padded = 0
    for run in sub_batches(lengths, max_tokens, run_cost):
        longest = lengths[run[-1]]
        ids, mask = pad([token_ids[i] for i in run], longest)
        vectors = encoder(ids, mask)
        if out is None:
            out = np.empty((len(token_ids), vectors.shape[1]), dtype=np.float32)
        out[run] = vectors
        padded += len(run) * longest
    if out is None:
        out = np.empty((0, embedding.HIDDEN_SIZE), dtype=np.float32)
    return out, padded


def tokenize(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Encode and pad a batch of texts (the reference path; the server pads per request)."""
    return pad(tokenization.encode(texts)[0])


def mean_pool(token_embeddings: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean over real tokens, then L2-normalize (sentence-transformers' pooling + Normalize).

    Args:
        token_embeddings: float32 [n, L, H].
        attention_mask: [n, L] of 0/1.

    Returns:
        float32 [n, H], unit length.
    """
    mask = attention_mask.astype(np.float32)[..., None]
    summed = np.einsum("nlh,nlo->nh", token_embeddings, mask)
    counts = np.maximum(mask.sum(axis=1), 1e-9)
    mean = summed / counts
    norms = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return (mean / norms).astype(np.float32)


def padding_cost(requests: Sequence[Sequence[int]]) -> dict[str, int]:
    """Tokens the encoder processes for requests of the given text lengths, per padding design.

    Args:
        requests: for each request, the token count of each of its texts.

    Returns:
        ``useful`` (real tokens), ``bucketed`` (each request padded to its own bucket, as
        tokenize does) and ``longest`` (everything padded to the longest text of the batch,
        what a plain batch tokenizer call does).
    """
    lengths = [n for texts in requests for n in texts]
    longest = max(lengths)
    return {
        "useful": sum(lengths),
        "bucketed": sum(len(texts) * bucket_length(max(texts)) for texts in requests),
        "longest": len(lengths) * longest,
    }
