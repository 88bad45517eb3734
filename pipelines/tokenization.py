"""Texts to word pieces: request items decoded with clear errors, then MiniLM's own tokenizer."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from pipelines import embedding, minilm_weights


def tokenizer_json(path: str | None = None, sha256: str | None = None) -> bytes:
    """A tokenizer.json: the MiniLM package's, or the file at ``path`` with its sha256 checked.

    ``sha256`` is the file's pinned digest: another model's tokenizer (a text service that
    ``python -m export sentence`` made) names its own; without it a file must be a copy of the
    package's, which stands in for the package where that does not travel (a GPU host:
    tests/gpu_text.py).

    Raises:
        ValueError: the file is not the pinned one.
    """
    if path is None:
        return minilm_weights.read_member("tokenizer.json")
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    pinned = sha256 or minilm_weights.TOKENIZER_SHA256
    if digest != pinned:
        raise ValueError(f"{path}: sha256 {digest} != pinned {pinned}")
    return data


@lru_cache(maxsize=4)
def tokenizer(path: str | None = None, sha256: str | None = None):
    """A model's tokenizer.json (``tokenizer_json``), truncating like sentence-transformers.

    MiniLM's file ships with fixed padding to 128 and truncation at 128; sentence-transformers
    truncates at 256 (at 128, long texts drift from the reference: docs/models.md). Padding is
    ours to choose (``pipelines.padding``), so the tokenizer does none; every text model here
    cuts at ``embedding.MAX_TOKENS``.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_buffer(tokenizer_json(path, sha256))
    tok.enable_truncation(max_length=embedding.MAX_TOKENS)
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
            raise TextError(f"{embedding.TEXT}[{i}]: {exc}") from None
    return texts


def encode(texts: Sequence[str]) -> tuple[list[list[int]], int]:
    """Word-piece ids of each text (with [CLS]/[SEP], truncated), and how many were truncated."""
    ids, lengths = encode_counted(texts)
    return ids, sum(n > embedding.MAX_TOKENS for n in lengths)


def encode_counted(texts: Sequence[str], tok=None) -> tuple[list[list[int]], list[int]]:
    """Word-piece ids of each text, cut at MAX_TOKENS, and how many each has uncut.

    The count comes from the cut-off pieces the tokenizer keeps (each with its own [CLS] and
    [SEP]), so a long text is tokenized once, not again without the cut. ``tok`` is a
    ``tokenizer()`` (default: the package's).
    """
    tok = tok if tok is not None else tokenizer()
    special = tok.post_processor.num_special_tokens_to_add(False)
    encodings = tok.encode_batch(list(texts))
    lengths = [len(e.ids) + sum(len(o.ids) - special for o in e.overflowing) for e in encodings]
    return [e.ids for e in encodings], lengths


def too_long(index: int, length: int) -> TextError:
    """The error for text ``index`` of a request, ``length`` word pieces long, not to be cut."""
    limit = embedding.MAX_TOKENS
    return TextError(
        f"{embedding.TEXT}[{index}]: text too long: {length} word pieces, over the limit of "
        f"{limit}; shorten it, or set {embedding.TRUNCATE} to true to embed its first {limit}"
    )
