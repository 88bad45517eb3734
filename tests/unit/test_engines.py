"""pipelines.backend.engines: the one place that picks how a step runs a graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines import classification
from pipelines.backend import engines


def test_onnxruntime_runs_the_graph_in_process(classifier_onnx):
    engine = engines.open_engine(classifier_onnx, [classification.LOGITS], {})
    assert (engine.runtime, engine.source) == ("onnxruntime", classifier_onnx)
    pixels = np.zeros((2, classification.CHANNELS, 224, 224), dtype=np.uint8)
    (logits,) = engine({classification.PIXELS: pixels})
    assert logits.shape == (2, classification.NUM_CLASSES)


def test_the_served_model_answers_from_its_plan_where_one_was_built(tmp_path: Path):
    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"graph")
    served = engines.Served("encoder", 2, 64)
    engine = engines.open_engine(graph, ["EMBEDDING"], {}, runtime="triton", served=served)
    assert (engine.runtime, engine.source) == ("triton", graph)
    (tmp_path / "model.plan").write_bytes(b"plan")
    engine = engines.open_engine(graph, ["EMBEDDING"], {}, runtime="triton", served=served)
    # The cache keys on this file: an engine's numbers are not its graph's.
    assert engine.source == tmp_path / "model.plan"


@pytest.mark.parametrize("runtime, served", [("tensorrt", None), ("triton", None)])
def test_a_runtime_it_cannot_open_is_refused_by_name(tmp_path: Path, runtime, served):
    with pytest.raises(ValueError, match=f"runtime '{runtime}': one of onnxruntime, triton"):
        engines.open_engine(tmp_path / "model.onnx", ["EMBEDDING"], {}, runtime, served)
