"""The GPU image path's parts, on the CPU: buckets, the bucketed runner, BatchNorm folding, top-k
on the device, the resize per source size, and classify_fused's torch runtime.

What only a GPU has (CUDA graphs, nvJPEG) runs in the GPU check; everything around it is here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from export import samples
from pipelines import buckets, classification, efficientnet_lite, gpu_image, image, imagenet
from pipelines.graphs import BucketedRunner
from tests.unit.test_models import failed, images, load, output, request

INVALID = 3  # pb_utils.TritonError.INVALID_ARG


# Buckets ---------------------------------------------------------------------------------------
def test_a_batch_pads_to_the_smallest_bucket_that_holds_it():
    sizes = buckets.DEFAULT
    assert [buckets.bucket_for(n, sizes) for n in (1, 8, 9, 33, 256)] == [8, 8, 16, 64, 256]
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        buckets.bucket_for(257, sizes)


def test_a_batch_over_the_largest_bucket_is_cut_into_full_runs_and_a_padded_rest():
    assert buckets.pieces(300, buckets.DEFAULT) == [(0, 256, 256), (256, 300, 64)]
    assert buckets.pieces(512, buckets.DEFAULT) == [(0, 256, 256), (256, 512, 256)]
    assert buckets.pieces(5, (8,)) == [(0, 5, 8)]
    assert buckets.padded_rows(300, buckets.DEFAULT) == 320
    assert buckets.pieces(0, buckets.DEFAULT) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("8,x", "comma-separated batch sizes"),
        ("16,8", "strictly increasing"),
        ("0,8", "positive sizes"),
        ("8,8", "strictly increasing"),
        ("8,16,64", "below max_batch_size"),
    ],
)
def test_bad_buckets_are_refused_with_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        buckets.parse(text, max_batch_size=128)


def test_buckets_that_reach_max_batch_size_parse():
    assert buckets.parse("8,16,128", max_batch_size=128) == (8, 16, 128)


# The bucketed runner ---------------------------------------------------------------------------
class Recorded:
    """A row-wise function that records the batch size of each call."""

    def __init__(self):
        self.weight = torch.arange(12, dtype=torch.float32).reshape(4, 3)
        self.sizes = []

    def __call__(self, x):
        self.sizes.append(len(x))
        return x.float() @ self.weight


def test_every_bucket_runs_once_at_start_and_batches_run_only_at_bucket_sizes():
    fn = Recorded()
    runner = BucketedRunner(fn, torch.zeros(4), (2, 4, 8))
    assert sorted(fn.sizes) == [2, 4, 8]  # warmed before any batch
    fn.sizes.clear()
    for n in (1, 3, 5, 8, 11, 17):
        batch = torch.randn(n, 4)
        torch.testing.assert_close(runner(batch), batch @ fn.weight)
    # 11 rows: one full 8 and the rest (3) padded to 4; 17: 8, 8 and 1 padded to 2.
    assert fn.sizes == [2, 4, 8, 8, 8, 4, 8, 8, 2]
    assert set(fn.sizes) <= {2, 4, 8}
    assert runner.runs == {2: 2, 4: 2, 8: 5}


def test_rows_left_from_an_earlier_batch_never_reach_a_later_answer():
    runner = BucketedRunner(Recorded(), torch.zeros(4), (8,))
    runner(torch.full((8, 4), 1e6))
    small = torch.ones(3, 4)
    assert runner(small).shape == (3, 3)
    torch.testing.assert_close(runner(small), small @ runner.fn.weight)


def test_cuda_graphs_fall_back_to_eager_runs_off_a_gpu():
    runner = BucketedRunner(Recorded(), torch.zeros(4), (4,), cuda_graphs=True)
    assert not runner.graphed and runner.graphs == {}
    torch.testing.assert_close(runner(torch.ones(2, 4)), torch.ones(2, 4) @ runner.fn.weight)


# The network and top-k -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pixels():
    batch, errors = image.preprocess_batch([samples.photo_bytes(n) for n in samples.PHOTOS])
    assert not any(errors)
    return torch.from_numpy(batch)


def test_batchnorm_folded_into_the_convolutions_gives_the_same_logits(pixels):
    with torch.inference_mode():
        want = efficientnet_lite.load_pretrained()(pixels)
        folded = efficientnet_lite.fold_batchnorm(efficientnet_lite.load_pretrained())
        got = folded(pixels)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert got.argmax(1).tolist() == want.argmax(1).tolist()


def test_top_k_on_the_device_equals_top_k_on_the_host():
    logits = torch.randn(5, classification.NUM_CLASSES)
    ids, scores = imagenet.top_k_tensor(logits, 7)
    want_ids, want_scores = imagenet.top_k(logits.numpy(), 7)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6)
    assert ids.dtype == np.int32 and scores.dtype == np.float32
    with pytest.raises(ValueError, match="between 1 and 1000"):
        imagenet.top_k_tensor(logits, 0)


def test_frames_of_one_size_resize_together_as_they_would_one_by_one():
    frames = [
        torch.from_numpy(np.asarray(image.decode(samples.photo_bytes(n))).copy()).permute(2, 0, 1)
        for n in ("chelsea", "coffee", "chelsea", "flower")
    ]
    out = torch.zeros((6, 3, 224, 224), dtype=torch.uint8)
    slots = [5, 0, 2, 3]
    gpu_image.resize_by_source_size(frames, out, slots)
    for frame, slot in zip(frames, slots, strict=True):
        torch.testing.assert_close(out[slot], gpu_image.crop_resize(frame))
    assert out[1].sum() == 0 and out[4].sum() == 0  # slots not named stay untouched


# classify_fused's torch runtime, as configs/gpu-local.pbtxt sets it, on a CPU instance ---------
def test_fused_classify_on_torch_answers_as_the_reference_and_fails_only_a_bad_image(
    monkeypatch, classifier_onnx
):
    from bench.harness.reference import ReferenceClassifier

    model = load(classification.FUSED, config_name="gpu-local")
    calls = []
    forward = model.pipeline.classifier.run
    monkeypatch.setattr(
        model.pipeline.classifier, "run", lambda x: calls.append(len(x)) or forward(x)
    )
    k = np.array([[3]], dtype=np.int32)
    responses = model.execute(
        [
            request(IMAGE=images("chelsea", "coffee")),
            request(IMAGE=np.array([[b"not an image"]], dtype=np.object_)),
            request(IMAGE=images("flower"), TOP_K=k),
        ]
    )
    assert calls == [3]  # one forward pass over the good requests' images
    reference = ReferenceClassifier(classifier_onnx)
    for response, names, top in (
        (responses[0], ("chelsea", "coffee"), 5),
        (responses[2], ("flower",), 3),
    ):
        _, scores, ids = reference.classify([samples.photo_bytes(n) for n in names], top)
        np.testing.assert_array_equal(output(response, classification.CLASS_IDS), ids)
        np.testing.assert_allclose(output(response, classification.SCORES), scores, atol=1e-3)
    assert failed(responses[1], INVALID, f"{classification.IMAGE}[0]: not an image")


def test_buckets_that_cannot_hold_max_batch_size_fail_the_model_at_load(monkeypatch):
    from pipelines.gpu_classifier import ImageClassifier

    with pytest.raises(ValueError, match="below max_batch_size"):
        ImageClassifier.from_parameters({"buckets": "8,16"}, "cpu", 256)


def test_a_batch_picks_the_first_engine_profile_that_takes_it():
    from pipelines.tensorrt_runner import profile_for

    ranges = [(1, 16), (17, 64), (65, 128)]
    assert [profile_for(n, ranges) for n in (1, 16, 17, 64, 65, 128)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="no optimization profile takes a batch of 129"):
        profile_for(129, ranges)
