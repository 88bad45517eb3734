"""perf_analyzer ``--input-data`` files made from real photos, one per model.

Run as a program, it writes such a file from your own images or texts (one request each):

    python -m bench.harness.inputs classify samples/*.jpg > classify.json
    python -m bench.harness.inputs embed texts.txt > embed.json   # a text per line
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import sys
from pathlib import Path

import numpy as np

from export import samples, text_samples
from pipelines import classification, embedding, image, padding, tokenization

# The embedding service's traffic: short queries, each its own request.
EMBED_MODELS = (embedding.ENSEMBLE, "embed_int8")  # ensembles with a response cache
TEXT_MODELS = (*EMBED_MODELS, embedding.GRAPH_ENSEMBLE)
# Mixed-length traffic (export.text_samples.mixed_texts): more texts than a run's mixed cases
# send, so that none repeats within a run (and no answer could come from a cache).
MIXED_TEXTS = 4000
MIXED_SEED = 0


def mixed_texts() -> list[str]:
    """The mixed-length texts every server gets, in the same order.

    Only texts within the model's MAX_TOKENS word pieces (5 of the first 4000 passages are
    over): embed refuses a longer one unless its request sets TRUNCATE, which the graph and the
    peers do not take, and they would cut it instead.
    """
    texts = text_samples.mixed_texts(MIXED_TEXTS + 100, MIXED_SEED)
    _, lengths = tokenization.encode_counted(texts)
    fitting = [t for t, n in zip(texts, lengths, strict=True) if n <= embedding.MAX_TOKENS]
    return fitting[:MIXED_TEXTS]


def _string_element(data: bytes) -> str:
    # perf_analyzer wants a BYTES element in Triton's serialized form: 4-byte LE length + bytes.
    return base64.b64encode(struct.pack("<I", len(data)) + data).decode()


def _tensor(array: np.ndarray) -> dict:
    return {
        "b64": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode(),
        "shape": list(array.shape),
    }


def image_entries(photos: list[bytes]) -> list[dict]:
    """One ``IMAGE`` request per encoded photo (classify and preprocess inputs)."""
    return [{classification.IMAGE: {"b64": _string_element(p), "shape": [1]}} for p in photos]


def entries(model: str, reference=None) -> list[dict]:
    """One perf_analyzer data entry per sample photo, for the given model's inputs.

    Args:
        model: ensemble or step name from pipelines.classification.
        reference: a ReferenceClassifier, needed only for postprocess inputs (real logits).
    """
    if model in TEXT_MODELS:
        # Plain strings: perf_analyzer sends them as BYTES, in binary or JSON requests alike.
        return [{embedding.TEXT: {"content": [t], "shape": [1]}} for t in text_samples.SENTENCES]
    if model == embedding.ENCODER:
        # Token ids as tokenize hands them on: each sentence padded to its length bucket.
        out = []
        for text in text_samples.SENTENCES:
            ids, mask = padding.tokenize([text])
            out.append(
                {embedding.INPUT_IDS: _tensor(ids[0]), embedding.ATTENTION_MASK: _tensor(mask[0])}
            )
        return out
    photos = [samples.photo_bytes(name) for name in samples.PHOTOS]
    if model in (classification.ENSEMBLE, classification.FUSED, classification.PREPROCESS):
        return image_entries(photos)
    pixels, _ = image.preprocess_batch(photos)
    if model == classification.CLASSIFIER:
        return [{classification.PIXELS: _tensor(px)} for px in pixels]
    if model == classification.POSTPROCESS:
        if reference is None:
            raise ValueError("postprocess inputs need a reference classifier for real logits")
        return [{classification.LOGITS: _tensor(row)} for row in reference.logits(pixels)]
    raise KeyError(f"no perf inputs for model {model!r}")


def repeated_text() -> list[dict]:
    """One text only: after the first request every answer is a response-cache hit."""
    return [{embedding.TEXT: {"content": [text_samples.SENTENCES[0]], "shape": [1]}}]


def json_entries(model: str) -> list[dict]:
    """Entries with plain JSON numbers (``--input-tensor-format json`` and the peer server)."""
    if model != classification.CLASSIFIER:
        raise KeyError("JSON payloads are made for the classifier only")
    pixels, _ = image.preprocess_batch([samples.photo_bytes(n) for n in samples.PHOTOS])
    return [
        {classification.PIXELS: {"content": px.reshape(-1).tolist(), "shape": list(px.shape)}}
        for px in pixels
    ]


def text_entries(texts: list[str]) -> list[dict]:
    """One ``TEXT`` request per text (KServe v2, binary or JSON alike)."""
    return [{embedding.TEXT: {"content": [t], "shape": [1]}} for t in texts]


def openai_entries(
    model: str, texts: list[str] | None = None, encoding_format: str | None = None
) -> list[dict]:
    """The same texts as OpenAI-style /embeddings bodies (perf_analyzer's ``openai`` client).

    One text per request, under ``model``, in the same order as ``entries`` (or ``texts``);
    with ``encoding_format`` (``base64`` is what OpenAI's SDK asks by default) if given.
    """
    if model not in TEXT_MODELS:
        raise KeyError("OpenAI-style bodies are made for the text models only")
    texts = list(text_samples.SENTENCES) if texts is None else texts
    extra = {} if encoding_format is None else {"encoding_format": encoding_format}
    return [{"payload": [{"model": model, "input": [t], **extra}]} for t in texts]


def write(
    model: str,
    directory: Path,
    reference=None,
    as_json: bool = False,
    repeated: bool = False,
    openai: bool = False,
    mixed: bool = False,
    encoding_format: str | None = None,
) -> Path:
    """Write ``<model>[-mixed][-json|-repeated|-openai[-<format>]].json`` into ``directory``.

    ``mixed``: the mixed-length texts (``mixed_texts``) instead of the short sample sentences;
    ``encoding_format``: the OpenAI bodies ask for it. Returns the path.
    """
    if mixed and model not in TEXT_MODELS:
        raise KeyError("mixed-length texts are made for the text models only")
    if mixed:
        texts = mixed_texts()
        data = openai_entries(model, texts) if openai else text_entries(texts)
        suffix = "-mixed-openai" if openai else "-mixed"
    elif openai:
        data = openai_entries(model, encoding_format=encoding_format)
        suffix = "-openai" + (f"-{encoding_format}" if encoding_format else "")
    elif repeated:
        data, suffix = repeated_text(), "-repeated"
    elif as_json and model not in TEXT_MODELS:  # texts are the same in both formats
        data, suffix = json_entries(model), "-json"
    else:
        data, suffix = entries(model, reference), ""
    path = directory / f"{model}{suffix}.json"
    path.write_text(json.dumps({"data": data}))
    return path


IMAGE_MODELS = (classification.ENSEMBLE, classification.FUSED, classification.PREPROCESS)


def main(argv: list[str] | None = None) -> int:
    """Print a ``--input-data`` JSON of one request per image file or per line of text files."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.harness.inputs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", choices=(*IMAGE_MODELS, *TEXT_MODELS))
    parser.add_argument(
        "files", nargs="+", type=Path, help="image files (sent as they are), or text files"
    )
    args = parser.parse_args(argv)
    try:
        if args.model in TEXT_MODELS:
            texts = [
                line
                for path in args.files
                for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()
            ]
            data = text_entries(texts)
        else:
            data = image_entries([path.read_bytes() for path in args.files])
    except OSError as exc:
        parser.error(f"cannot read {exc.filename}: {exc.strerror}")
    if not data:
        parser.error("no requests: the text files hold no text")
    json.dump({"data": data}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
