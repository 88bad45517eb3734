"""Load shedding at 4x capacity: every request answered, rejections clear and immediate.

Runs the benchmark itself (``python -m client.perf.overload``) in its own process: it pins the
server to one core and its open-loop sender to the other, measures capacity, offers 4x that
rate for a few seconds with the ``local-shed`` configs (queue policies on preprocess and the
classifier), and writes every count to JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration


def test_every_request_at_4x_capacity_is_answered_or_rejected_at_once(tmp_path, classifier_onnx):
    out = tmp_path / "overload.json"
    command = [sys.executable, "-m", "client.perf.overload", "--seconds", "5", "--json", str(out)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    report = json.loads(out.read_text())
    print(result.stdout)
    # The exit status says: all answered, only queue rejections, admitted p99 within the SLO.
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert report["offered"] >= 3.5 * report["capacity"]  # really overloaded
    assert report["sent"] == report["answered"] and report["hung"] == 0
    assert report["ok"] > 0 and report["errors"].get("queue-full", 0) > report["ok"]
    assert set(report["errors"]) <= {"queue-full", "queue-timeout"}
    # "Exceeds maximum queue size" comes back at once: the request never waited anywhere.
    assert report["rejection_ms"]["queue-full"]["p50"] < 20
    assert report["ok_ms"]["p99"] <= report["slo_ms"]
