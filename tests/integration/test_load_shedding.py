"""Load shedding at 4x capacity: every request answered, the server still at full capacity.

Runs the benchmark itself (``python -m client.perf.overload``) in its own process: it pins the
server to one core and its open-loop sender to the other, measures capacity, offers 4x that
rate for a few seconds with the ``local-shed`` configs (queue timeouts on preprocess and the
classifier), and writes every count to JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration


def test_every_request_at_4x_capacity_is_answered_and_goodput_holds(tmp_path, classifier_onnx):
    out = tmp_path / "overload.json"
    command = [sys.executable, "-m", "client.perf.overload", "--seconds", "5", "--json", str(out)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    report = json.loads(out.read_text())
    print(result.stdout)
    # The exit status says: all answered, only queue rejections, admitted p99 within the SLO.
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert report["offered"] >= 3.5 * report["capacity"]  # really overloaded
    assert report["sent"] == report["answered"] and report["hung"] == 0
    assert set(report["errors"]) <= {"queue-full", "queue-timeout"}
    # Goodput: shedding by queue timeout keeps the server doing useful work near its capacity
    # (measured 0.79-1.06x); a small queue limit collapsed it to 19-36 req/s on 2.51.
    admitted_per_s = report["ok"] / report["seconds"]
    assert admitted_per_s >= 0.7 * report["capacity"], (admitted_per_s, report["capacity"])
    assert report["ok_ms"]["p99"] <= report["slo_ms"]
    # Every rejection came back in bounded time: the queue timeouts on its path, plus the moment
    # the batcher next looks at its queue (measured max 2.39-2.54 s against 2.5 s + 1 s here).
    bound_ms = report["slo_ms"] + 1000
    assert all(ms["max"] <= bound_ms for ms in report["rejection_ms"].values())
