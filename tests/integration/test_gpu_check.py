"""The GPU check's script (`make gpu-check`), rehearsed here on the CPU.

The smoke plan runs every stage of the GPU run (raw model, raw pipeline, the gpu-local
configs served by a real tritonserver, perf_analyzer, statistics, metrics) in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration


def test_gpu_check_smoke_runs_every_stage_on_the_cpu(tmp_path, classifier_onnx):
    out = tmp_path / "gpu-check"
    command = [sys.executable, "-m", "tests.gpu_check", "run", "--smoke", "--out", str(out)]
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


PROBE_MODEL = """
import importlib.util
import sys


class TritonPythonModel:
    def initialize(self, args):
        found = {m: importlib.util.find_spec(m) is not None for m in ("from_overlay", "from_env")}
        print("PROBE", found, "ISOLATED", sys.flags.isolated, flush=True)

    def execute(self, requests):
        return []
"""
PROBE_CONFIG = """name: "probe"
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""
START_PROBE = """
import sys
from pathlib import Path
from server import Server, ServerConfig
config = ServerConfig(model_repository=Path(sys.argv[1]), http_port=0, grpc_port=0,
                      metrics_port=0, model_config_name=None)
with Server(config) as server:
    print([l for l in server.log_path.read_text().splitlines() if "PROBE" in l][0])
"""


def test_the_stubs_import_what_the_overlay_lists_and_ignore_pythonpath(tmp_path, monkeypatch):
    """The Python-backend stub of Python 3.11+ runs an isolated interpreter (pybind11 2.10):
    PYTHONPATH does not reach it, the site-packages of the `python3` first on PATH do. The GPU
    check therefore serves from a virtual environment whose .pth lists the bundle."""
    from tests import gpu_check

    unpacked, elsewhere, repository = tmp_path / "site", tmp_path / "env", tmp_path / "repo"
    for folder, module in ((unpacked, "from_overlay"), (elsewhere, "from_env")):
        folder.mkdir()
        (folder / f"{module}.py").write_text("")
    (repository / "probe" / "1").mkdir(parents=True)
    (repository / "probe" / "1" / "model.py").write_text(PROBE_MODEL)
    (repository / "probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    python = gpu_check.overlay(unpacked)
    result = subprocess.run(
        [str(python), "-c", START_PROBE, str(repository)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(elsewhere)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if sys.version_info >= (3, 11):
        assert "'from_overlay': True, 'from_env': False" in result.stdout, result.stdout
        assert "ISOLATED 1" in result.stdout
