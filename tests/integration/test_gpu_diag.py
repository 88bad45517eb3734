"""The GPU diagnosis (`make gpu-diag`), rehearsed here on the CPU.

Its smoke plan runs every phase of the GPU run (the in-process measurements, one server with the
variants under their own names, answers checked under load, a second server with larger
memory pools) in a few minutes, so the script that needs a GPU host's scarce minutes has run
end to end before it gets them. The figures of a CPU run mean nothing; the plumbing does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration

MIN_COSINE_FP32 = 0.99999  # torch fp32 against the fp32 ONNX encoder: summation order only


@pytest.mark.timeout(900)
def test_gpu_diag_smoke_runs_every_phase_on_the_cpu(tmp_path, classifier_onnx):
    out = tmp_path / "gpu-diag"
    command = [sys.executable, "-m", "tests.gpu_diag", "run", "--smoke", "--out", str(out)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=840)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "gpu-diag.json").read_text())
    assert not [n for n in report["notes"] if n.startswith("failed")], report["notes"]
    assert report["host"]["device"] == "cpu" and "tensorrt" in report["host"]
    # One OpenMP thread: a rehearsal on a shared CPU (tests/gpu_check.SMOKE_ENVIRONMENT).
    assert report["host"]["torch_threads"] == int(os.environ.get("OMP_NUM_THREADS", "1"))
    assert report["cold"]["sizes"] and report["cold"]["without_cudnn"]
    assert report["ipc"] == {"skipped": "no GPU"}
    assert all(row["chain"] > 0 for row in report["ceiling"].values())
    measured = {(row["label"], row["server"]) for row in report["levels"]}
    # Each kind of model (the ensemble, its host hand-over variant, the one step), the sampler
    # level and the second server: a level that did not stabilize on a busy machine is a note,
    # so at least the ensemble, the one step and the second server must have answered.
    assert {("V0", "server1"), ("V4", "server1"), ("V6", "server2")} <= measured, report["notes"]
    for row in report["levels"]:
        assert row["throughput"] > 0 and row["steps"], row
        assert all(step["executions"] > 0 for step in row["steps"].values()), row
        # The stubs of this server only, each named by its model instance.
        assert all(name == "tritonserver" or "_" in name for name in row["cpu_share"]), row
    fused = next(r for r in report["levels"] if r["label"] == "V4")
    assert list(fused["steps"]) == ["classify_fused"]
    for model in ("classify", "classify_fused"):
        answers = report["answers"][model]
        assert answers["top1_equal_in_process"] == 1.0, answers
        assert answers["top1_equal_cpu_pipeline"] == 1.0, answers
    # The text service on the same server, with the text run's smoke plan (fp32 here: the
    # package's weights, no bundle), as tests/gpu_text.py's own run measures it.
    text = report["text"]
    assert text["in_process"]["cosine_min"] >= MIN_COSINE_FP32, text["in_process"]
    assert set(text["in_process"]["texts_per_s"]) == {"short 4", "mixed 4"}
    served = text["served"]
    assert not served["notes"] and served["cosine_min"] >= MIN_COSINE_FP32, served
    assert [(r["texts"], r["concurrency"]) for r in served["levels"]] == [
        ("short", 2),
        ("mixed", 2),
    ]
    for row in served["levels"]:
        assert row["texts_per_s"] > 0 and row["avg_batch"] >= 1 and row["batch_histogram"], row
        assert row["cache_hits"] == 0, row
    assert (out / "embed-short.json").exists() and (out / "embed-mixed.json").exists()
    assert set(report["log_signs"]) == {"server1", "server2"}
    assert (out / "server1.log").exists() and (out / "gpu-diag.md").read_text().count("| V") >= 3
