"""`make gpu-check`'s script, rehearsed here on the CPU so it works when a GPU is lent.

The smoke plan runs every stage of the H200 run (raw model, raw pipeline, the gpu-local
configs served by a real tritonserver, perf_analyzer, statistics, metrics) in seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration


def test_gpu_check_smoke_runs_every_stage_on_the_cpu(tmp_path, classifier_onnx):
    out = tmp_path / "gpu-check"
    command = [sys.executable, "-m", "client.perf.gpu_check", "run", "--smoke", "--out", str(out)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["device"] == "cpu" and not report["notes"], report["notes"]
    assert report["top1_agreement"] == 1.0
    assert all(v > 0 for v in report["raw_model"].values()) and report["raw_pipeline"] > 0
    (row,) = report["served"]
    assert row["throughput"] > 0 and row["p99_ms"] > 0
    assert set(row["avg_batch"]) == {"preprocess", "classifier", "postprocess"}
    assert report["summary"]["served_over_raw_model"] > 0
    assert "nv_inference_count" in (out / "metrics.txt").read_text()
    assert "served classify" in (out / "gpu-check.md").read_text()
    assert (REPO / "Makefile").read_text().count("client.perf.gpu_check") == 2
