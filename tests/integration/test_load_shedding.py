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
    # Goodput: the server keeps doing useful work near its capacity. What this guards against:
    # with one instance per shedding step the same small queue collapses classify to a fraction
    # of its capacity on 2.51. Both measured, busy machine included:
    # docs/operations.md#load-shedding.
    admitted_per_s = report["ok"] / report["seconds"]
    assert admitted_per_s >= 0.6 * report["capacity"], (admitted_per_s, report["capacity"])
    assert report["ok_ms"]["p99"] <= report["slo_ms"]
    # The excess is refused at once, at the entrance, before the costly work is spent on it;
    # queue timeouts further on are a backstop. Without the queue-size limit every rejection is
    # a timeout after a second (0 % queue-full); the shares seen: docs/operations.md.
    rejected = sum(report["errors"].values())
    assert report["errors"].get("queue-full", 0) >= 0.75 * rejected > 0
    # Fast: a queue-full rejection is answered at the entrance, a timeout rejection takes at
    # least 1 s (0.4 of the SLO); the p99s seen: docs/operations.md.
    assert report["rejection_ms"]["queue-full"]["p99"] <= 0.1 * report["slo_ms"]
    # Every rejection, backstop included, came back within the SLO plus 1 s.
    bound_ms = report["slo_ms"] + 1000
    assert all(ms["max"] <= bound_ms for ms in report["rejection_ms"].values())
