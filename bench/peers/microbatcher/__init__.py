r"""Peer baseline: a model served by FastAPI + uvicorn with an asyncio micro-batcher.

This is what a Python user would build instead of Triton, done well: uvicorn with uvloop and
httptools (one worker process), orjson both ways, numpy conversions without Python loops, and the
"BatchScheduler" pattern — requests put ``(rows, future)`` on an asyncio queue; one background
task collects up to ``max_batch`` rows, waiting at most ``max_wait_ms`` after the first, runs ONE
model call in a worker thread (so the event loop keeps accepting) and splits the result.

It serves one of two models (``--model-name``), under the same name and tensors as in Triton:

- ``classifier``: PIXELS FP32 [-1, 3, 224, 224] → LOGITS FP32 [-1, 1000], one onnxruntime run
  per micro-batch.
- ``embed``: TEXT BYTES [-1, 1] → EMBEDDING FP32 [-1, 384] (all-MiniLM-L6-v2), per micro-batch
  one tokenizer call, one onnxruntime run of the encoder and one mean pooling, with the texts
  padded to the longest of the micro-batch, as a plain batched ``encode()`` does.

It speaks the subset of the KServe v2 HTTP protocol that Triton's ``perf_analyzer`` uses, so the
same load generator with the same payload drives both::

    python -m bench.peers.microbatcher --port 8010 &
    perf_analyzer -m classifier -u 127.0.0.1:8010 -i http \
        --input-tensor-format json --output-tensor-format json --input-data zero

    python -m bench.peers.microbatcher --model-name embed --port 8011 &
    perf_analyzer -m embed -u 127.0.0.1:8011 -i http --input-data texts.json

Tensors may be JSON (flat or nested ``data``; strings for BYTES) or Triton's binary tensor
extension (``Inference-Header-Content-Length``; BYTES elements as 4-byte little-endian length +
bytes). ``--null`` answers zeros without running the model and without converting the inputs
(their count and types are still checked), to measure the ceiling of the load generator and the
HTTP/JSON exchange.

The package, one job per module: ``models`` (what runs per micro-batch), ``protocol`` (KServe v2
decoding and encoding), ``stats`` (Triton-shaped statistics), ``batcher`` (the micro-batcher),
``app`` (the FastAPI endpoints), ``process`` (the managed process), ``cli`` (the command line).
"""

from bench.peers.microbatcher.app import create_app
from bench.peers.microbatcher.batcher import MicroBatcher
from bench.peers.microbatcher.cli import main, parse_args
from bench.peers.microbatcher.models import (
    DEFAULT_EMBED_MODEL,
    DEFAULT_MODEL,
    MODEL_NAME,
    served_model,
)
from bench.peers.microbatcher.process import PeerServer

__all__ = [
    "DEFAULT_EMBED_MODEL",
    "DEFAULT_MODEL",
    "MODEL_NAME",
    "MicroBatcher",
    "PeerServer",
    "create_app",
    "main",
    "parse_args",
    "served_model",
]
