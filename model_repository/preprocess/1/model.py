"""Triton adapter: encoded images → uint8 pixels (pipelines.image does the work)."""

import time

from pipelines import classification as spec
from pipelines import image
from pipelines.backend import batching as bk
from pipelines.backend import metrics


class TritonPythonModel:
    """Decodes every image of every request in one pass; a bad image fails only its request.

    On a KIND_GPU instance nvJPEG decodes on that GPU where it can (pipelines.gpu_image), and
    the pixels leave through DLPack for the classifier on the same GPU.
    """

    def initialize(self, args):
        """Note this instance's device; create its metrics."""
        self.name = args["model_name"]
        self.device = bk.instance_device(args)
        self.metrics = metrics.PreprocessMetrics(args)
        self.respond = bk.respond_arrays if self.device == "cpu" else bk.respond_tensors

    def finalize(self):
        """Release the metric series before the stub exits."""
        self.metrics.close()

    def _parse(self, request) -> list[bytes]:
        try:
            items = bk.inputs(request, [spec.IMAGE])[spec.IMAGE].reshape(-1)
        except bk.RequestError:
            self.metrics.failed(["no images in the request"])
            raise
        return [bytes(item) for item in items]

    def _pixels(self, images: list[bytes]):
        if self.device == "cpu":
            return image.preprocess_batch(images)
        from pipelines import gpu_image  # torch: only GPU instances import it

        return gpu_image.preprocess_batch(images, self.device)

    def _run(self, items: list[list[bytes]]) -> list[dict | Exception]:
        # Host time on both paths (on a GPU instance the resize may still be running).
        started = time.perf_counter()
        pixels, errors = self._pixels([img for images in items for img in images])
        self.metrics.batch(time.perf_counter() - started, errors)
        outputs, offset = [], 0
        for images in items:
            n = len(images)
            bad = [(i, e) for i, e in enumerate(errors[offset : offset + n]) if e is not None]
            if bad:
                index, exc = bad[0]
                outputs.append(bk.RequestError(f"{spec.IMAGE}[{index}]: {exc}"))
            else:
                outputs.append({spec.PIXELS: pixels[offset : offset + n]})
            offset += n
        return outputs

    def execute(self, requests):
        """One response per request, in order."""
        return bk.execute(
            requests, self._parse, self._run, model=self.name, respond=self.respond, rows=len
        )
