"""Post-processing math and labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines import classification, imagenet


def test_softmax_is_a_distribution_even_for_huge_logits():
    logits = np.array([[1000.0, 999.0, -1000.0], [0.0, 0.0, 0.0]], np.float32)
    probs = imagenet.softmax(logits)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probs[1], 1 / 3, rtol=1e-6)
    assert probs.dtype == np.float32


@pytest.mark.parametrize("k", [1, 5, 1000])
def test_top_k_matches_a_full_sort(k: int):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(7, classification.NUM_CLASSES)).astype(np.float32)
    ids, scores = imagenet.top_k(logits, k)
    expected = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids, expected)
    # The probabilities from another implementation (PyTorch, in float64), not imagenet.softmax,
    # which top_k itself calls.
    probs = torch.softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
    np.testing.assert_allclose(scores, np.take_along_axis(probs, expected, -1), rtol=1e-5)
    assert ids.dtype == np.int32
    assert (np.diff(scores, axis=-1) <= 0).all()


@pytest.mark.parametrize("k", [0, -1, 1001])
def test_top_k_rejects_k_out_of_range(k: int):
    with pytest.raises(ValueError, match="TOP_K must be between 1 and 1000"):
        imagenet.top_k(np.zeros((1, classification.NUM_CLASSES), np.float32), k)


def test_labels_are_the_imagenet_names():
    labels = imagenet.imagenet_labels()
    assert len(labels) == classification.NUM_CLASSES
    assert labels[0] == "tench"
    assert labels[285] == "Egyptian cat"
    names = imagenet.label_names(np.array([[285, 967]]))
    assert names.shape == (1, 2)
    assert names.tolist() == [[b"Egyptian cat", b"espresso"]]
