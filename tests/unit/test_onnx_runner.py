"""onnxruntime sessions: the thread budget follows the cores the process may use."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

PROBE = (
    "from pipelines import onnx_runner; "
    "s = onnx_runner.create_session('{model}', intra_op_threads=4); "
    "print(onnx_runner.usable_cores(), s.get_session_options().intra_op_num_threads)"
)


def threads_when_pinned(model, cores: set[int]) -> tuple[int, int]:
    code = f"import os; os.sched_setaffinity(0, {cores!r}); " + PROBE.format(model=model)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    usable, threads = map(int, done.stdout.split())
    return usable, threads


def test_a_process_pinned_to_one_core_gets_one_intra_op_thread(classifier_onnx):
    assert threads_when_pinned(classifier_onnx, {0}) == (1, 1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_two_usable_cores_keep_a_budget_of_two(classifier_onnx):
    assert threads_when_pinned(classifier_onnx, {0, 1}) == (2, 2)
