"""Triton adapter: encoded images → normalized pixels (pipelines.image does the work)."""

import time

from pipelines import classification as spec
from pipelines import image, metrics
from pipelines import triton_backend as tb


class TritonPythonModel:
    """Decodes every image of every request in one pass; a bad image fails only its request.

    On a KIND_GPU instance nvJPEG decodes on that GPU where it can (pipelines.gpu_image), and
    the pixels leave through DLPack for the classifier on the same GPU.
    """

    def initialize(self, args):
        """Note this instance's device; create its metrics."""
        self.device = tb.instance_device(args)
        self.metrics = metrics.PreprocessMetrics(args)

    def finalize(self):
        """Release the metric series before the stub exits."""
        self.metrics.close()

    def _pixels(self, images):
        if self.device == "cpu":
            pixels, errors = image.preprocess_batch(images)
            return pixels, errors, tb.respond
        from pipelines import gpu_image  # torch: only GPU instances import it

        pixels, errors = gpu_image.preprocess_batch(images, self.device)
        return pixels, errors, tb.respond_tensors

    def execute(self, requests):
        """One response per request, in order."""
        images, sizes, live = [], [], []
        for request in requests:
            items = tb.input_array(request, spec.IMAGE).reshape(-1)
            ok = not request.is_cancelled() and len(items) > 0
            live.append(ok)
            sizes.append(len(items) if ok else 0)
            if ok:
                images.extend(bytes(item) for item in items)
        # Host time on both paths (on a GPU instance the resize may still be running).
        started = time.perf_counter()
        pixels, errors, respond = self._pixels(images)
        self.metrics.batch(time.perf_counter() - started, errors)
        responses, offset = [], 0
        for request, ok, n in zip(requests, live, sizes, strict=True):
            if not ok:
                if request.is_cancelled():
                    responses.append(tb.cancelled())
                else:
                    self.metrics.failed(["no images in the request"])
                    responses.append(tb.error(f"{spec.IMAGE} is empty"))
                continue
            bad = [(i, e) for i, e in enumerate(errors[offset : offset + n]) if e is not None]
            if bad:
                index, exc = bad[0]
                responses.append(tb.error(f"{spec.IMAGE}[{index}]: {exc}"))
            else:
                responses.append(respond({spec.PIXELS: pixels[offset : offset + n]}))
            offset += n
        return responses
