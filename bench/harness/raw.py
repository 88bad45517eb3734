"""The raw engine in-process: the physical limit that served numbers are divided by.

Run as ``python -m bench.harness.raw`` under ``taskset`` so it gets exactly the cores (and the
onnxruntime thread budget) that the server's instances get.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from bench.harness.reference import ReferenceClassifier
from export import samples
from pipelines import classification, embedding, image, imagenet, padding, tokenization


def throughput(
    step: Callable[[], None], items_per_step: int, seconds: float, warm_up: bool = True
) -> float:
    """Items per second of ``step`` over at least ``seconds`` (after one warm-up call)."""
    if warm_up:
        step()
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or done == 0:
        step()
        done += items_per_step
    return done / elapsed


def model_curve(
    reference: ReferenceClassifier, batch_sizes: Sequence[int], seconds: float
) -> dict[int, float]:
    """Classifier alone: preprocessed pixels in, logits out, images/s per batch size."""
    photos = [samples.photo_bytes(n) for n in samples.PHOTOS]
    pixels, _ = image.preprocess_batch(photos)
    curve = {}
    for bs in batch_sizes:
        batch = np.ascontiguousarray(np.resize(pixels, (bs, *pixels.shape[1:])))
        curve[bs] = throughput(lambda b=batch: reference.logits(b), bs, seconds)
    return curve


def pipeline_curve(
    reference: ReferenceClassifier, batch_sizes: Sequence[int], seconds: float
) -> dict[int, float]:
    """The whole classify pipeline in-process: JPEG bytes → top-k labels, images/s."""
    photos = [samples.photo_bytes(n) for n in samples.PHOTOS]
    curve = {}
    for bs in batch_sizes:
        batch = [photos[i % len(photos)] for i in range(bs)]
        curve[bs] = throughput(lambda b=batch: reference.classify(b), bs, seconds)
    return curve


# The classify pipeline's stages, in the order it runs them, and those each served step runs.
STAGES = ("decode", "crop and resize", "to NCHW", "model", "top-k and labels")
STEP_STAGES = {
    classification.PREPROCESS: STAGES[:3],
    classification.CLASSIFIER: STAGES[3:4],
    classification.POSTPROCESS: STAGES[4:],
    classification.FUSED: STAGES,
}
STAGE_KIND = "stage:"  # raw curves "stage:<name>" hold one stage's images/s at batch 1


def stage_times(reference: ReferenceClassifier, seconds: float) -> dict[str, float]:
    """Milliseconds per image of each stage of the whole pipeline at batch 1.

    Each stage is timed inside the pipeline loop, right after the one before it, so that it meets
    the caches as the pipeline leaves them (a stage timed alone in a loop of its own runs warmer
    and faster); their sum is the pipeline's latency for one image.
    """
    photos = [samples.photo_bytes(n) for n in samples.PHOTOS]
    totals = dict.fromkeys(STAGES, 0.0)
    done, start = 0, time.perf_counter()
    while done < 2 * len(photos) or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        img = image.decode(photos[done % len(photos)], min_side=image.DECODE_MIN_SIDE)
        t1 = time.perf_counter()
        rgb = image.center_crop_resize(img)
        t2 = time.perf_counter()
        pixels = image.to_pixels(rgb[None])
        t3 = time.perf_counter()
        logits = reference.logits(pixels)
        t4 = time.perf_counter()
        imagenet.label_names(imagenet.top_k(logits, classification.DEFAULT_TOP_K)[0])
        t5 = time.perf_counter()
        done += 1
        if done > len(photos):  # the first pass over the photos warms up
            for name, a, b in zip(STAGES, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5), strict=True):
                totals[name] += b - a
    measured = done - len(photos)
    return {name: total / measured * 1000 for name, total in totals.items()}


def serve(reference: ReferenceClassifier, lines, out) -> None:
    """Measure the pipeline on request: each ``BATCH SECONDS`` line gets one JSON line back.

    A long-lived reference beside a server: its startup (onnxruntime, the model, a warm-up)
    is paid once, so each measurement takes only its seconds and can sit right beside the
    served case it is compared with.
    """
    photos = [samples.photo_bytes(n) for n in samples.PHOTOS]
    for line in lines:
        batch, seconds = int(line.split()[0]), float(line.split()[1])
        images = [photos[i % len(photos)] for i in range(batch)]
        value = throughput(lambda b=images: reference.classify(b), batch, seconds)
        out.write(json.dumps({"batch": batch, "images_per_s": value}) + "\n")
        out.flush()


def embed_curve(
    onnx_path: Path, threads: int, batch_sizes: Sequence[int], seconds: float
) -> dict[int, float]:
    """The embed pipeline in-process: texts → tokenize → encoder (pools), texts/s per batch.

    Short queries (the sample sentences), padded to the longest of each batch.
    """
    from export import text_samples
    from pipelines import onnx_runner

    session = onnx_runner.create_session(onnx_path, intra_op_threads=threads)
    texts = list(text_samples.SENTENCES)

    def step(batch: list[str]) -> None:
        tokens, _ = tokenization.encode(batch)
        # To the batch's longest text, not to a tokenizer bucket: what a plain batcher runs.
        ids, mask = padding.pad(tokens, max(map(len, tokens)))
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        onnx_runner.run(session, feeds, [embedding.EMBEDDING])

    curve = {}
    for bs in batch_sizes:
        batch = [texts[i % len(texts)] for i in range(bs)]
        curve[bs] = throughput(lambda b=batch: step(b), bs, seconds)
    return curve


def _encoder(onnx_path: Path, threads: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """(ids, mask) → embeddings: the encoder graph on one onnxruntime session."""
    from pipelines import onnx_runner

    session = onnx_runner.create_session(onnx_path, intra_op_threads=threads)

    def encoder(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        return onnx_runner.run(session, feeds, [embedding.EMBEDDING])[0]

    return encoder


def mixed_curves(
    onnx_path: Path, threads: int, texts: Sequence[str], batch_sizes: Sequence[int], seconds: float
) -> dict[str, dict[int, float]]:
    """The embed pipeline over mixed-length texts, per batch size: two ways to batch them.

    Consecutive texts form each batch (tokenized in the measured step, as a server does), which
    is then run (a) as one run padded to its longest text, as a plain batcher does
    ("mixed_padded"), or (b) sorted into sub-batches by ``pipelines.padding.encode_sorted``
    ("mixed_sorted"). Texts/s of each, and padded ÷ real token positions over all the batches
    of ``texts`` ("mixed_padded_ratio", "mixed_sorted_ratio").
    """
    from pipelines import padding, tokenization

    encoder = _encoder(onnx_path, threads)

    def padded_run(tokens: list[list[int]]) -> int:
        ids, mask = padding.pad(tokens, max(map(len, tokens)))
        encoder(ids, mask)
        return ids.size

    def sorted_run(tokens: list[list[int]]) -> int:
        return padding.encode_sorted(encoder, tokens)[1]

    all_tokens, _ = tokenization.encode(list(texts))
    padded_run(all_tokens[:8])  # the first run allocates and plans
    out: dict[str, dict[int, float]] = {}
    for name, run in (("mixed_padded", padded_run), ("mixed_sorted", sorted_run)):
        out[name], out[f"{name}_ratio"] = {}, {}
        for bs in batch_sizes:
            batches = [list(texts[i : i + bs]) for i in range(0, len(texts) - bs + 1, bs)]
            position = iter(range(10**9))

            def step(batches=batches, position=position, run=run) -> None:
                tokens, _ = tokenization.encode(batches[next(position) % len(batches)])
                run(tokens)

            # One padded batch of passages takes seconds: warmed up once (above), not per size.
            out[name][bs] = throughput(step, bs, seconds, warm_up=False)
            covered = [all_tokens[i : i + bs] for i in range(0, len(texts) - bs + 1, bs)]
            positions = sum(_positions(name, t) for t in covered)
            out[f"{name}_ratio"][bs] = positions / sum(sum(map(len, t)) for t in covered)
    return out


def _positions(name: str, tokens: list[list[int]]) -> int:
    """Token positions one batch feeds the encoder, padding included, batched as ``name``."""
    from pipelines import padding

    if name == "mixed_padded":
        return len(tokens) * max(map(len, tokens))
    lengths = [len(t) for t in tokens]
    return sum(len(run) * lengths[run[-1]] for run in padding.sub_batches(lengths))


def main(argv: list[str] | None = None) -> int:
    """Print {"model": {bs: img/s}, "pipeline": {bs: img/s}, "embed...": ...} as JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.harness.raw", description=__doc__)
    p.add_argument("--onnx", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    p.add_argument("--model-batches", default="1,4,8,16,32")
    p.add_argument("--pipeline-batches", default="1,8,16")
    p.add_argument("--seconds", type=float, default=2.0, help="per batch size")
    p.add_argument(
        "--stages", action="store_true", help="also time each stage of the pipeline at batch 1"
    )
    p.add_argument(
        "--encoder",
        action="append",
        default=[],
        help="NAME=PATH of an encoder ONNX to measure the embed pipeline with",
    )
    p.add_argument("--embed-batches", default="1,8,32")
    p.add_argument(
        "--mixed-encoder",
        type=Path,
        help="encoder ONNX to measure the embed pipeline with over mixed-length texts",
    )
    p.add_argument("--mixed-batches", default="8,32")
    p.add_argument(
        "--serve",
        action="store_true",
        help="only measure the pipeline on request: read 'BATCH SECONDS' lines from stdin",
    )
    args = p.parse_args(argv)
    sizes = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    reference = ReferenceClassifier(args.onnx, intra_op_threads=args.threads)
    if args.serve:
        serve(reference, sys.stdin, sys.stdout)
        return 0
    result = {
        "threads": args.threads,
        "model": model_curve(reference, sizes(args.model_batches), args.seconds),
        "pipeline": pipeline_curve(reference, sizes(args.pipeline_batches), args.seconds),
    }
    if args.stages:
        # As images/s at batch 1, the unit of every raw curve.
        times = stage_times(reference, args.seconds)
        result.update({STAGE_KIND + name: {1: 1000 / ms} for name, ms in times.items()})
    for spec_ in args.encoder:
        name, _, path = spec_.partition("=")
        result[name] = embed_curve(
            Path(path), args.threads, sizes(args.embed_batches), args.seconds
        )
    if args.mixed_encoder:
        from bench.harness import inputs

        result.update(
            mixed_curves(
                args.mixed_encoder,
                args.threads,
                inputs.mixed_texts(),
                sizes(args.mixed_batches),
                args.seconds,
            )
        )
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
