"""onnxruntime's default thread pool against one intra-op thread, on the cores we may use.

infinity-emb creates its onnxruntime session with default options and has no option for its
threads; ``embed`` and the FastAPI peer size theirs explicitly (one thread per server core). This
measures what that default costs on the same exported MiniLM graph, in-process, so that the
served comparison can be read with it. It needs only numpy, onnxruntime and tokenizers, so it runs
in infinity's own environment, with its onnxruntime::

    taskset -c 1 .peers/infinity/venv/bin/python -m bench.ort_threads
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

MODEL_DIR = Path(__file__).resolve().parent.parent / ".peers" / "infinity" / "model" / "onnx"
# Short sentences of the kind the benchmark sends (export/text_samples.py).
TEXTS = (
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Triton batches requests from many clients into one model execution.",
    "A monkey is playing drums.",
)


def session(model: Path, intra_op_threads: int | None):
    """A CPU session with onnxruntime's default threads, or ``intra_op_threads`` of them."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if intra_op_threads is not None:
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def feeds(model_dir: Path, batch: int) -> dict[str, np.ndarray]:
    """Token ids, mask and type ids of ``batch`` texts, padded to the longest."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_padding()
    tok.no_truncation()
    encoded = tok.encode_batch([TEXTS[i % len(TEXTS)] for i in range(batch)])
    return {
        "input_ids": np.array([e.ids for e in encoded], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], np.int64),
    }


def texts_per_second(sess, inputs: dict[str, np.ndarray], seconds: float) -> float:
    """Texts per second of repeated runs over ``seconds`` (after one warm-up run)."""
    wanted = {i.name for i in sess.get_inputs()}
    inputs = {k: v for k, v in inputs.items() if k in wanted}
    sess.run(None, inputs)
    batch = len(next(iter(inputs.values())))
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sess.run(None, inputs)
        done += batch
    return done / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line per thread setting and batch size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    for threads in (None, 1):
        sess = session(args.model_dir / "model.onnx", threads)
        for batch in (int(b) for b in args.batches.split(",")):
            rate = texts_per_second(sess, feeds(args.model_dir, batch), args.seconds)
            result = {
                "intra_op_threads": "default" if threads is None else threads,
                "batch": batch,
                "texts_per_s": round(rate, 1),
                "process_threads": len(os.listdir("/proc/self/task")),
                "cores": cores,
            }
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
