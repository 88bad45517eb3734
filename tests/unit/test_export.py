"""Export pieces: weights checks, TF padding, pad folding, and a parity check that can fail."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export import efficientnet_lite0, onnx_export
from pipelines import efficientnet_lite


def test_weights_are_refused_when_the_sha256_differs(tmp_path):
    fake = tmp_path / "weights.pth"
    torch.save({"x": torch.zeros(1)}, fake)
    with pytest.raises(ValueError, match="sha256"):
        efficientnet_lite.load_pretrained(fake)


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "expected"),
    [(224, 3, 2, (0, 1)), (56, 5, 2, (1, 2)), (14, 5, 1, (2, 2)), (112, 3, 1, (1, 1))],
)
def test_tf_same_padding_puts_the_odd_pixel_after(size, kernel, stride, expected):
    assert efficientnet_lite.same_padding(size, kernel, stride) == expected


def test_pretrained_network_loads_strictly_and_sees_a_cat(photos):
    from pipelines import image, imagenet

    model = efficientnet_lite.load_pretrained()
    with torch.no_grad():
        logits = model(torch.from_numpy(image.preprocess(photos["chelsea"])[None])).numpy()
    assert imagenet.imagenet_labels()[int(logits.argmax())] in {
        "tabby",
        "tiger cat",
        "Egyptian cat",
    }


class PaddedNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = efficientnet_lite.SamePadConv(32, 3, 8, 3, 2)

    def forward(self, x):
        return self.body(x)


def test_pads_fold_into_convs_without_changing_results(tmp_path):
    torch.manual_seed(0)
    model = PaddedNet().eval()
    x = torch.randn(2, 3, 32, 32)
    path = tmp_path / "padded.onnx"
    proto = onnx_export.export(
        model, (x,), path, ["x"], ["y"], {"x": {0: "batch"}, "y": {0: "batch"}}
    )
    assert [n.op_type for n in proto.graph.node if n.op_type in ("Pad", "Conv")] == ["Conv"]
    got = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, model(x).detach().numpy(), atol=1e-5)


def test_parity_check_fails_for_a_different_network(classifier_onnx):
    pixels = efficientnet_lite0.photos_batch()[:2]
    model = efficientnet_lite.load_pretrained()
    with torch.no_grad():
        model._fc.bias += 0.01  # a tiny change no fp32 export could explain
    with pytest.raises(SystemExit, match="parity check failed"):
        efficientnet_lite0.check_parity(model, classifier_onnx, pixels)


def test_parity_check_passes_for_the_exported_model(classifier_onnx):
    pixels = efficientnet_lite0.photos_batch()
    report = efficientnet_lite0.check_parity(
        efficientnet_lite.load_pretrained(), classifier_onnx, pixels
    )
    assert report.max_abs_diff <= efficientnet_lite0.FP32_ATOL
    assert report.top1_agreement == 1.0
