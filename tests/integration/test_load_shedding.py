"""Load shedding at 4x capacity: every request answered, the excess refused fast, goodput held.

Runs the benchmark itself (``python -m bench.overload``) in its own process: it pins the
server to one core and its open-loop sender to the other, measures capacity, offers 4x that
rate for a few seconds with the ``local-shed`` configs, and writes every count to JSON. Both
ensembles: ``classify`` sheds at its entrance (preprocess, 16 waiting), ``embed`` at its costly
step (the encoder, 64 waiting); every step with a policy also has a 1 s queue timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration


# The exported ONNX files each service serves.
MODELS = {"classify": "classifier_onnx", "embed": "encoder_onnx"}


@pytest.mark.parametrize("service", sorted(MODELS))
def test_at_4x_capacity_every_request_is_answered_excess_refused_fast_goodput_held(
    tmp_path, request, service
):
    request.getfixturevalue(MODELS[service])
    out = tmp_path / "overload.json"
    command = [
        *(sys.executable, "-m", "bench.overload", "--service", service),
        *("--seconds", "5", "--json", str(out)),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    report = json.loads(out.read_text())
    print(result.stdout)
    # The exit status says: all answered, only queue rejections, admitted p99 within the SLO
    # (the queue timeouts on the path plus the executions, which grow on a slower machine).
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert report["offered"] >= 3.5 * report["capacity"]  # really overloaded
    assert report["sent"] == report["answered"] and report["hung"] == 0
    assert set(report["errors"]) <= {"queue-full", "queue-timeout"}
    # Goodput: the server keeps doing useful work near its capacity. Measured: classify
    # 0.93-1.27x in 30 runs of 5 s, 0.75x once in CI, 1.17-1.31x with one core kept busy;
    # embed 1.5-1.8x, its batches fill better than at the concurrency of 4 that measures
    # capacity. What this guards against: with one instance per shedding step the same small
    # queue collapsed classify to 17-36 req/s (0.17-0.36x) on 2.51 (preprocess/configs/local-shed).
    admitted_per_s = report["ok"] / report["seconds"]
    assert admitted_per_s >= 0.6 * report["capacity"], (admitted_per_s, report["capacity"])
    assert report["ok_ms"]["p99"] <= report["slo_ms"]
    # The excess is refused at once, at the entrance, before the costly work is spent on it;
    # queue timeouts further on are a backstop. Measured: queue-full 94.5-100 % of rejections
    # (88-93 % for classify with the server's core shared with a busy loop); without the
    # queue-size limit every rejection is a timeout after a second (0 %).
    rejected = sum(report["errors"].values())
    assert report["errors"].get("queue-full", 0) >= 0.75 * rejected > 0
    # Fast: measured p99 5.6-38 ms, busy core included, against an SLO of 2.5 s; a timeout
    # rejection takes at least 1 s (0.4 of it).
    assert report["rejection_ms"]["queue-full"]["p99"] <= 0.1 * report["slo_ms"]
    # Every rejection, backstop included, came back within the SLO plus 1 s.
    bound_ms = report["slo_ms"] + 1000
    assert all(ms["max"] <= bound_ms for ms in report["rejection_ms"].values())
