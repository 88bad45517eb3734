"""The HPA's metric, from a real tritonserver: the counters exist, and the adapter query works.

The last test evaluates the prometheus-adapter rule's query on a real Prometheus (Debian's
`prometheus` package, which `make test` installs) scraping the test server.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from client.embed import EmbedClient
from model_config import parse, resolve
from paths import MODEL_REPOSITORY
from pipelines import embedding
from server.launcher import free_port
from tests.helpers import prometheus_tool

pytestmark = pytest.mark.integration

ADAPTER = Path(__file__).resolve().parents[2] / "docker" / "kubernetes" / "prometheus-adapter.yaml"
QUEUE = "nv_inference_queue_duration_us"
COMPUTE = "nv_inference_compute_infer_duration_us"
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')
MODELS = {p.parent.name for p in MODEL_REPOSITORY.glob("*/config.pbtxt")}
ENSEMBLES = {
    p.parent.name
    for p in MODEL_REPOSITORY.glob("*/config.pbtxt")
    if parse(p).platform == "ensemble"
}
# The labels Prometheus's pod discovery would add; the adapter turns them into label matchers.
NAMESPACE, POD = "triton", "triton-0"

Samples = dict[tuple[str, frozenset], float]


def adapter_rule() -> dict:
    (configmap,) = [d for d in yaml.safe_load_all(ADAPTER.read_text()) if d]
    (rule,) = yaml.safe_load(configmap["data"]["config.yaml"])["rules"]
    return rule


def scrape(server) -> tuple[str, Samples]:
    """The /metrics text and its samples as {(name, labels): value}."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if match := SAMPLE.match(line):
            name, labels, value = match.groups()
            samples[name, frozenset(LABEL.findall(labels))] = float(value)
    return text, samples


def total(samples: Samples, name: str, models: set[str]) -> float:
    return sum(
        v for (n, labels), v in samples.items() if n == name and dict(labels)["model"] in models
    )


def settled(read: Callable[[], object], done: Callable[[object], bool] = bool, timeout=15.0):
    """``read()`` once it satisfies ``done`` and two reads in a row agree.

    Triton records statistics as requests are released, which can trail the response a little.
    """
    deadline = time.monotonic() + timeout
    previous, current = None, read()
    while not (done(current) and current == previous) and time.monotonic() < deadline:
        time.sleep(0.2)
        previous, current = current, read()
    return current


def counters(server) -> Samples:
    """The samples of the two counters the rule reads (the rest of /metrics moves on its own)."""
    return {k: v for k, v in scrape(server)[1].items() if k[0] in (QUEUE, COMPUTE)}


def embed(server, count: int) -> None:
    with EmbedClient(server.http_url, "http") as client:
        for _ in range(count):
            # Texts never sent before, so the response cache answers none of them.
            client.embed([f"a text nobody has embedded before {uuid.uuid4()}"])


def test_rule_metrics_are_per_model_counters(server):
    metrics = set(re.findall(r"\bnv_\w+", adapter_rule()["metricsQuery"]))
    assert metrics == {QUEUE, COMPUTE}
    # Triton 2.51 registers both families at model load (at 0); one request first all the same,
    # so the test does not rest on that.
    embed(server, 1)
    text, samples = scrape(server)
    for name in metrics:
        # A counter, so the rule's rate() applies.
        assert f"# TYPE {name} counter" in text
        labelled = [dict(labels) for n, labels in samples if n == name]
        # One series per loaded model and version, the labels the rule filters and sums over.
        assert {labels["model"] for labels in labelled} == MODELS
        assert all(labels.keys() == {"model", "version"} for labels in labelled)


def test_ensemble_compute_repeats_its_steps_compute(server):
    # Why the adapter rule leaves ensembles out: their compute counter is the sum of their steps'.
    steps = {
        s.model_name
        for s in resolve(
            MODEL_REPOSITORY / embedding.ENSEMBLE, server.config.model_config_name
        ).ensemble_scheduling.step
    }
    _, before = scrape(server)
    embed(server, 1)

    def deltas() -> tuple[float, float]:
        _, after = scrape(server)
        return tuple(
            total(after, COMPUTE, models) - total(before, COMPUTE, models)
            for models in ({embedding.ENSEMBLE}, steps)
        )

    ensemble, summed = settled(deltas, lambda d: d[0] > 0)
    assert summed > 0
    assert ensemble == pytest.approx(summed, rel=0.01, abs=10)


@pytest.fixture
def warmed(server):
    """The server after a few requests, with its statistics settled.

    rate() extrapolates a counter's increase no further back than where it would have been 0,
    and that limit is the same for every series only when each is already well above 0.
    """
    embed(server, 10)
    settled(lambda: counters(server))
    return server


@pytest.fixture
def prometheus(warmed, tmp_path):
    """A real Prometheus scraping the test server every second; yields its query function."""
    binary = prometheus_tool("prometheus")
    port = free_port()
    target = warmed.metrics_url.removeprefix("http://").removesuffix("/metrics")
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "triton",
                "static_configs": [
                    {"targets": [target], "labels": {"namespace": NAMESPACE, "pod": POD}}
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def query(promql: str) -> list[dict]:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                answer = json.load(response)
        except OSError:  # not listening yet
            return []
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    try:
        yield query
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_adapter_query_on_prometheus_is_queue_over_compute_without_ensembles(server, prometheus):
    rule = adapter_rule()
    # What prometheus-adapter sends for `pods/<metric>` of one pod of the HPA's namespace.
    query = (
        rule["metricsQuery"]
        .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"{POD}"')
        .replace("<<.GroupBy>>", "pod")
    )

    def ratio() -> list[float]:
        return [float(r["value"][1]) for r in prometheus(query) if r["metric"] == {"pod": POD}]

    def latest_compute() -> float:
        result = prometheus(f'sum({COMPUTE}{{pod="{POD}"}})')
        return float(result[0]["value"][1]) if result else -1.0

    before = counters(server)
    # Idle: one series reading 0, not 0/0 (no value, which leaves the HPA without this pod).
    assert settled(ratio, lambda r: bool(r), timeout=60) == [0.0]

    embed(server, 10)
    after = settled(lambda: counters(server), lambda s: s != before)
    wanted = total(after, COMPUTE, MODELS)
    assert settled(latest_compute, lambda v: v == wanted, timeout=30) == wanted, "not scraped"

    # Both rates cover the same scrapes, so their ratio is the ratio of the counters' increases.
    workers = MODELS - ENSEMBLES
    queued, computed = (
        total(after, m, workers) - total(before, m, workers) for m in (QUEUE, COMPUTE)
    )
    assert computed > 0
    (served,) = ratio()
    assert served == pytest.approx(queued / computed, rel=1e-6)
    with_ensembles = (total(after, QUEUE, MODELS) - total(before, QUEUE, MODELS)) / (
        total(after, COMPUTE, MODELS) - total(before, COMPUTE, MODELS)
    )
    assert served > 1.5 * with_ensembles  # counting the ensemble would have halved it
