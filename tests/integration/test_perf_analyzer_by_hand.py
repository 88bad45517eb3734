"""The lines of docs/performance.md#perf_analyzer-by-hand, run as written against the server.

Every line of the section's shell blocks runs in the repository's root with bash, in order, as a
reader pastes them: with the ports of ``make serve`` (8000 HTTP, 8001 gRPC) replaced by the
test run's server and ``/tmp/`` by this test's own folder. Each perf_analyzer line gets a short
run appended (one level, half-second windows; perf_analyzer takes the last of an option given
twice), and must succeed and report a throughput.
"""

from __future__ import annotations

import re

import pytest

from paths import REPO_ROOT
from tests.helpers import bash

pytestmark = pytest.mark.integration

DOC = REPO_ROOT / "docs" / "performance.md"
SECTION = "## perf_analyzer by hand"
WRAPPER = "bench/perf_analyzer"
SHORT_RUN = (
    " --concurrency-range 1 --measurement-interval 150 --max-trials 6 --stability-percentage 100"
)
THROUGHPUT = re.compile(r"^Concurrency: 1, throughput: ([0-9.]+) infer/sec", re.MULTILINE)


def documented_lines() -> list[str]:
    """The section's shell lines, in order (blank lines and whole-line comments left out)."""
    text = DOC.read_text()
    assert text.count(SECTION + "\n") == 1, f"{DOC} has no single '{SECTION}' section"
    section = text.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    return [
        line
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_the_section_has_both_models_over_both_protocols():
    runs = {
        (re.search(r" -m (\S+)", line)[1], re.search(r" -i (\S+)", line)[1])
        for line in documented_lines()
        if line.startswith(WRAPPER)
    }
    assert runs == {(m, p) for m in ("classify", "embed") for p in ("http", "grpc")}


def test_the_documented_lines_run_and_report_a_throughput(server, tmp_path):
    for line in documented_lines():
        command = (
            line.replace("localhost:8000", server.http_url)
            .replace("localhost:8001", server.grpc_url)
            .replace("/tmp/", f"{tmp_path}/")
        )
        analyzer = line.startswith(WRAPPER)
        if analyzer:
            assert "#" not in line, f"a comment would swallow the short run: {line}"
            command += SHORT_RUN
        stdout = bash(command, cwd=REPO_ROOT, timeout=180)
        if analyzer:
            found = THROUGHPUT.search(stdout)
            assert found and float(found[1]) > 0, f"{command}\n{stdout[-2000:]}"
