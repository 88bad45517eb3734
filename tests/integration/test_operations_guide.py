"""docs/operations.md's admin-key calls and first metrics, run against the session's tritonserver.

The guide's curl line for the repository index runs as written (only the address changed), with
the server's admin key and with a wrong one; every PromQL line of its five metrics names series
that the server or the gateway's exporter serves, and a bad image counts as the guide says.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from client import ClassifyClient, ClientError
from gateway import access_log
from paths import REPO_ROOT
from tests import promql
from tests.helpers import bash

PAGE = REPO_ROOT / "docs" / "operations.md"


def marked_block(marker: str, language: str) -> str:
    """The fenced block that follows ``<!-- marker -->`` in the operations guide."""
    match = re.search(rf"<!-- {marker} -->\s*```{language}\n(.*?)```", PAGE.read_text(), re.S)
    assert match, f"docs/operations.md has no block marked {marker}"
    return match.group(1)


def run_index_call(server, key: str) -> str:
    """The guide's repository-index line, as written but for the address, with KEY set."""
    [line] = [x for x in marked_block("admin-key-curl", "bash").splitlines() if "/index" in x]
    script = line.replace("localhost:8000", server.http_url)
    return bash(script, env={"PATH": "/usr/bin:/bin", "KEY": key}, timeout=30)


def test_the_guides_index_call_lists_the_models_with_the_key(server):
    index = json.loads(run_index_call(server, server.config.admin_key))
    ready = {entry["name"] for entry in index if entry.get("state") == "READY"}
    assert {"classify", "embed"} <= ready


def test_the_guides_index_call_is_refused_with_a_wrong_key(server):
    answer = run_index_call(server, "not-the-admin-key-0123456789")
    assert "This API is restricted, expecting header 'admin-key'" in answer


def metrics_page(server) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        return response.read().decode()


def first_metrics() -> list[str]:
    block = marked_block("first-metrics", "promql")
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_every_first_metric_is_served(server, photos):
    with ClassifyClient(server.http_url) as c:  # the latency summaries appear with a request
        c.classify([photos["chelsea"]])
    # The exporter's families, as prometheus_client names a counter's and a histogram's samples.
    gateway = {f"{access_log.METRIC}_total", f"{access_log.DURATION_METRIC}_bucket"}
    known = promql.exported_metric_names(metrics_page(server)) | gateway
    queries = first_metrics()
    assert len(queries) == 5
    for query in queries:
        names = promql.metric_names(query)
        assert names and names <= known, f"{query}: {names - known} not served"


def failures(server, model: str) -> float:
    pattern = re.compile(rf'^nv_inference_request_failure\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$')
    return sum(
        float(m.group(1)) for m in map(pattern.match, metrics_page(server).splitlines()) if m
    )


def test_a_bad_image_counts_twice_as_a_failure_of_the_ensemble(server):
    # The guide's caveat on metric 1: tritonserver 2.51 counts a failed ensemble request twice.
    before = failures(server, "classify")
    with ClassifyClient(server.http_url) as c, pytest.raises(ClientError, match="not an image"):
        c.classify([b"not an image"])
    assert failures(server, "classify") == before + 2
