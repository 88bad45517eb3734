"""The image models' Python-backend adapters: preprocess, postprocess, and classify_fused.

preprocess and postprocess are the Python steps of the ``classify`` ensemble. classify_fused
runs the same pipeline in one step. On the CPU every Python step costs a round trip to its stub
process and meets caches the previous step's process left cold, which together cost more than
the steps' own work (measured: docs/performance.md); on a GPU it also keeps every GPU tensor in
one process (docs/gpu.md). One execute decodes every image of every request, runs the
classifier once over the decoded ones and takes each request's top k. Requests are read,
refused and answered by the same functions in all three, so the paths answer alike, errors
included.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np

from pipelines import classification, image, imagenet
from pipelines.backend import batching, engines, step_metrics, step_traces, torch_io


# What each request holds, and what it gets back -------------------------------------------------
def read_images(request, failures: step_metrics.PreprocessMetrics) -> list[bytes]:
    """The encoded images of one request, checked before any is decoded.

    ``RequestError`` (counted) if it has none, or if their headers add up to more pixels than
    one request may decode (``image.MAX_REQUEST_PIXELS``).
    """
    try:
        items = batching.inputs(request, [classification.IMAGE])[classification.IMAGE].reshape(-1)
    except batching.RequestError:
        failures.failed(["no images in the request"])
        raise
    images = [bytes(item) for item in items]
    total = sum(map(image.pixels_of, images))
    if total > image.MAX_REQUEST_PIXELS:
        problem = (
            f"images too large: {classification.IMAGE} holds {total} pixels or more, over the "
            f"{image.MAX_REQUEST_PIXELS} one request may decode"
        )
        failures.failed([problem])
        raise batching.RequestError(problem)
    return images


def read_top_k(request, default: int) -> int:
    """The request's TOP_K (one value for all its images), or ``default`` without one."""
    ks = batching.input_array(request, classification.TOP_K)
    if ks is None:
        return default
    ks = ks.reshape(-1)
    if len(ks) == 0 or np.any(ks != ks[0]):
        raise batching.RequestError(
            f"{classification.TOP_K} must be one value for the whole request, got {ks}"
        )
    k = int(ks[0])
    if not 1 <= k <= classification.NUM_CLASSES:
        raise batching.RequestError(
            f"{classification.TOP_K} must be between 1 and {classification.NUM_CLASSES}, got {k}"
        )
    return k


def spans(counts: list[int]) -> list[tuple[int, int]]:
    """(start, end) of consecutive runs of ``counts`` rows: each request's rows of a batch."""
    return list(itertools.pairwise(itertools.accumulate(counts, initial=0)))


def per_request(counts: list[int], errors: list) -> list[tuple[int, int] | batching.RequestError]:
    """Each request's (start, end) rows of a batch of images, or the error of its first bad one."""
    out = []
    for start, end in spans(counts):
        bad = [(i, e) for i, e in enumerate(errors[start:end]) if e is not None]
        out.append(
            batching.RequestError(f"{classification.IMAGE}[{bad[0][0]}]: {bad[0][1]}")
            if bad
            else (start, end)
        )
    return out


def respond_top_k(logits: np.ndarray, rows: list[tuple[int, int]], ks: list[int]) -> list[dict]:
    """LABELS, SCORES and CLASS_IDS of requests that own ``rows`` of ``logits`` and asked ``ks``.

    One softmax and sort for all of them, with the largest k asked.
    """
    return top_k_answers(*imagenet.top_k(logits, max(ks)), rows, ks)


def top_k_answers(
    ids: np.ndarray, scores: np.ndarray, rows: list[tuple[int, int]], ks: list[int]
) -> list[dict]:
    """Each request's outputs from the top ``max(ks)`` ids and scores of all their rows."""
    out = []
    for (start, end), k in zip(rows, ks, strict=True):
        # Rows are sorted, so the first k of the largest k are this request's top k.
        request_ids = ids[start:end, :k]
        out.append(
            {
                classification.LABELS: imagenet.label_names(request_ids),
                classification.SCORES: scores[start:end, :k],
                classification.CLASS_IDS: request_ids,
            }
        )
    return out


# The models ------------------------------------------------------------------------------------
class PreprocessModel:
    """preprocess: every image of every request decoded in one pass; a bad image fails its request.

    On a KIND_GPU instance nvJPEG decodes on that GPU where it can (pipelines.gpu_image), and
    the pixels leave through DLPack for the classifier on the same GPU.
    """

    def initialize(self, args):
        """Note this instance's device; create its metrics."""
        self.name = args["model_name"]
        self.device = torch_io.instance_device(args)
        self.metrics = step_metrics.PreprocessMetrics(args)
        self.respond = batching.respond_arrays if self.device == "cpu" else torch_io.respond_tensors
        # output_device cpu: decode on the GPU, hand the pixels over in host memory (a
        # diagnostic variant: no GPU tensor crosses to the classifier's process).
        self.to_host = (
            self.device != "cpu" and batching.parameters(args).get("output_device") == "cpu"
        )

    def finalize(self):
        """Release the metric series before the stub exits."""
        self.metrics.close()

    def _pixels(self, images: list[bytes]):
        if self.device == "cpu":
            return image.preprocess_batch(images)
        from pipelines import gpu_image  # torch: only GPU instances import it

        return gpu_image.preprocess_batch(images, self.device)

    def _run(self, items: list[list[bytes]]) -> list[dict | Exception]:
        # Host time on both paths (on a GPU instance the resize may still be running).
        started = time.perf_counter()
        encoded = [img for images in items for img in images]
        with step_traces.phase("decode", images=len(encoded)):
            pixels, errors = self._pixels(encoded)
        if self.to_host:
            pixels = pixels.cpu()
        self.metrics.batch(time.perf_counter() - started, errors)
        return [
            rows
            if isinstance(rows, Exception)
            else {classification.PIXELS: pixels[rows[0] : rows[1]]}
            for rows in per_request([len(images) for images in items], errors)
        ]

    def execute(self, requests):
        """One response per request, in order."""
        return batching.execute(
            requests,
            lambda r: read_images(r, self.metrics),
            self._run,
            model=self.name,
            respond=self.respond,
            rows=len,
        )


class PostprocessModel:
    """postprocess: softmax and top-k once over all requests; each request keeps its own k."""

    def initialize(self, args):
        """Read the default k; load the label table before the first request."""
        self.name = args["model_name"]
        self.default_k = int(batching.parameters(args).get("top_k", classification.DEFAULT_TOP_K))
        imagenet.label_names(np.zeros(1, dtype=np.int32))

    def _parse(self, request) -> tuple[np.ndarray, int]:
        k = read_top_k(request, self.default_k)
        return batching.inputs(request, [classification.LOGITS])[classification.LOGITS], k

    def _run(self, items: list[tuple[np.ndarray, int]]) -> list[dict]:
        rows = spans([len(x) for x, _ in items])
        return respond_top_k(np.concatenate([x for x, _ in items]), rows, [k for _, k in items])

    def execute(self, requests):
        """One response per request, in order; a bad TOP_K fails only its request."""
        return batching.execute(
            requests, self._parse, self._run, model=self.name, rows=lambda item: len(item[0])
        )


class OnnxImagePipeline:
    """``classify_fused``'s work on a CPU: Pillow, the classifier's model.onnx, numpy top-k."""

    def __init__(self, engine: engines.Engine):
        self.engine = engine

    @staticmethod
    def preprocess(images: list[bytes]):
        """uint8 pixels [n, 3, 224, 224] and each image's error or None."""
        return image.preprocess_batch(images)

    def top_k(self, pixels: np.ndarray, wanted: np.ndarray, k: int):
        """(class ids, scores) of the ``wanted`` rows of ``pixels``, k each."""
        (logits,) = self.engine({classification.PIXELS: pixels[wanted]})
        return imagenet.top_k(logits, k)


class FusedClassifyModel:
    """classify_fused: image bytes to top-k labels in one execute.

    On a CPU (``runtime`` onnxruntime, the default) Pillow decodes and the classifier's own
    model.onnx runs on onnxruntime. On a GPU instance (``runtime: torch``, configs/gpu-local)
    nvJPEG decodes, the model runs in PyTorch at padded batch sizes (CUDA graphs) and the top k
    are taken on the GPU (``pipelines.gpu_classifier.TorchImagePipeline``).
    """

    def initialize(self, args):
        """Open the model this config names, on this instance's device; load the labels."""
        self.name = args["model_name"]
        params = batching.parameters(args)
        self.default_k = int(params.get("top_k", classification.DEFAULT_TOP_K))
        if params.get("runtime") == "torch":
            from pipelines.gpu_classifier import TorchImagePipeline  # torch: GPU hosts only

            device = torch_io.instance_device(args)
            self.pipeline = TorchImagePipeline(params, device, batching.max_batch_size(args))
        else:
            # The path is relative to the repository, which is this model folder's parent.
            onnx_path = Path(args["model_repository"]).parent / params["model"]
            engine = engines.open_engine(onnx_path, [classification.LOGITS], params)
            self.pipeline = OnnxImagePipeline(engine)
        self.metrics = step_metrics.PreprocessMetrics(args)
        imagenet.label_names(np.zeros(1, dtype=np.int32))

    def finalize(self):
        """Release the metric series before the stub exits."""
        self.metrics.close()

    def _parse(self, request) -> tuple[list[bytes], int]:
        k = read_top_k(request, self.default_k)
        return read_images(request, self.metrics), k

    def _run(self, items: list[tuple[list[bytes], int]]) -> list[dict | Exception]:
        started = time.perf_counter()
        pixels, errors = self.pipeline.preprocess([img for images, _ in items for img in images])
        self.metrics.batch(time.perf_counter() - started, errors)
        slots = per_request([len(images) for images, _ in items], errors)
        good = [
            (rows, k) for rows, (_, k) in zip(slots, items, strict=True) if isinstance(rows, tuple)
        ]
        outputs = []
        if good:
            # Only the requests whose images all decoded reach the model, in one run.
            wanted = np.concatenate([np.arange(*rows) for rows, _ in good])
            ks = [k for _, k in good]
            ids, scores = self.pipeline.top_k(pixels, wanted, max(ks))
            outputs = top_k_answers(ids, scores, spans([e - s for (s, e), _ in good]), ks)
        answers = iter(outputs)
        return [rows if isinstance(rows, Exception) else next(answers) for rows in slots]

    def execute(self, requests):
        """One response per request, in order; a bad image or TOP_K fails only its request."""
        return batching.execute(
            requests, self._parse, self._run, model=self.name, rows=lambda item: len(item[0])
        )
