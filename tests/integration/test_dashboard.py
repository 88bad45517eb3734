"""The Grafana dashboard and the alert rules against a real tritonserver's /metrics.

Every metric a panel, a dashboard variable or a rule names must be one that our running server
or the gateway's exporter (``gateway/access_log.py``) exports, or one the SLO rules record;
a real Prometheus then scrapes both, evaluates the alert and SLO rules, and every dashboard query.

GPU metrics cannot come from this machine's server (no GPU): they are checked against a GPU
server's page when there is one (the live server if it exports ``nv_gpu_*``, else
``docs/gpu/metrics.txt`` written by a GPU-check run), otherwise against the names Triton
registers in its source (``TRITON_GPU_METRICS``), and the test says which one it used.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest, start_http_server

import model_config
from client.embed import EmbedClient
from gateway.access_log import AccessLogExporter
from monitoring import slo
from paths import MODEL_REPOSITORY
from server.launcher import free_port
from tests import promql
from tests.alerting import Prometheus

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docker" / "grafana" / "dashboards" / "triton.json"
ALERTS = REPO / "docker" / "prometheus" / "alerts.yml"
RULE_FILES = (ALERTS, slo.RULES)
GPU_METRICS_PAGE = REPO / "docs" / "gpu" / "metrics.txt"

# The GPU metric families Triton 2.51 registers when built with TRITON_ENABLE_METRICS_GPU
# (triton-inference-server/core, src/metrics.cc, Metrics::Metrics(): gpu_utilization_family_ ...
# gpu_energy_consumption_family_), all labelled by gpu_uuid. The CPU server here has none.
TRITON_GPU_METRICS = frozenset(
    {
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
    }
)
CACHED_TEXT = "Dashboards should show cache hits too."
SCRAPE_INTERVAL_S = 1
RATE_WINDOW = "15s"  # stands for $__rate_interval: several scrapes of SCRAPE_INTERVAL_S


def is_gpu_metric(name: str) -> bool:
    return name.startswith("nv_gpu_") or name == "nv_energy_consumption"


def all_queries() -> list[promql.Query]:
    queries = promql.dashboard_queries(json.loads(DASHBOARD.read_text()))
    for path in RULE_FILES:
        queries += promql.rule_queries(yaml.safe_load(path.read_text()))
    return queries


def recorded_names() -> set[str]:
    """The series the rule files record (``slo:...``): no page exports them, Prometheus does."""
    return {
        rule["record"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def send_traffic(server, repeats: int = 3) -> None:
    """Computed requests and response-cache hits, so every per-model counter has moved."""
    with EmbedClient(server.http_url, "http") as client:
        client.embed([f"Fresh text number {time.monotonic_ns()}."])
        for _ in range(repeats):
            client.embed([CACHED_TEXT])


def metrics_page(server) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def gateway_exporter(tmp_path_factory):
    """The gateway's exporter over a log of admitted and refused requests, serving /metrics."""
    access_log = tmp_path_factory.mktemp("gateway") / "access.log"
    entry = (
        '{{"tenant":"team-a","model":"embed","protocol":"http","limit":"{}","status":"200",'
        '"request_time":"0.012","upstream_time":"0.010"}}\n'
    )
    access_log.write_text(entry.format("PASSED") * 3 + entry.format("REJECTED"))
    exporter = AccessLogExporter(access_log, interval=0.1)
    port = free_port()
    with exporter:
        http_server, thread = start_http_server(port, "127.0.0.1", registry=exporter.registry)
        try:
            yield exporter, f"127.0.0.1:{port}", access_log, entry
        finally:
            http_server.shutdown()
            thread.join(timeout=5)


@pytest.fixture(scope="module")
def exported(server, gateway_exporter) -> set[str]:
    send_traffic(server)
    gateway = generate_latest(gateway_exporter[0].registry).decode()
    return promql.exported_metric_names(metrics_page(server) + gateway)


def test_server_page_has_the_per_model_and_cache_families(exported):
    # Guards the checks below against an empty or wrong page.
    assert {"nv_inference_count", "nv_cache_num_hits_per_model"} <= exported


def test_the_server_reports_p50_p90_p99_per_model_for_request_queue_and_compute(server):
    """Latency quantiles from the server itself (ServerConfig.summary_latencies), per model."""
    send_traffic(server)
    page = metrics_page(server)
    # 2.51 keeps no request summary for a model with the response cache on (embed): its queue
    # and compute summaries, and its steps' request summaries, are there (docs/triton-2.51.md).
    wanted = {(kind, m) for kind in ("queue", "compute_infer") for m in ("embed", "classify")}
    wanted |= {(kind, m) for kind in ("request", "queue") for m in embed_steps(server)}
    found: dict[tuple[str, str], dict[str, dict[str, float]]] = {}  # (kind, model) → version → q
    for kind in ("request", "queue", "compute_infer"):
        for labels, value in samples(page, f"nv_inference_{kind}_summary_us"):
            versions = found.setdefault((kind, labels["model"]), {})
            versions.setdefault(labels["version"], {})[labels["quantile"]] = value
    for kind, model in sorted(wanted):
        versions = found.get((kind, model), {})
        assert versions and all(set(q) == {"0.5", "0.9", "0.99"} for q in versions.values())
        if model == "classify":
            continue  # no traffic here: the series exist, with no value yet (NaN)
        # The version that served (a model's other versions have no observation: NaN).
        (quantiles,) = [q for q in versions.values() if not math.isnan(q["0.5"])]
        if kind != "queue":  # a request may wait no measurable time in a queue
            assert 0 < quantiles["0.5"] <= quantiles["0.9"] <= quantiles["0.99"], (kind, model)


def test_every_non_gpu_metric_of_the_dashboard_and_alerts_is_exported(exported):
    known = exported | promql.PROMETHEUS_SCRAPE_SERIES | recorded_names()
    unknown = {
        where: {n for n in names if not is_gpu_metric(n)}
        for where, names in promql.unknown_metrics(all_queries(), known).items()
    }
    assert not {w: n for w, n in unknown.items() if n}, "not on the server's /metrics page"


def gpu_metric_names(exported: set[str]) -> tuple[set[str], str]:
    """The GPU metric names to check against, and where they come from."""
    live = {n for n in exported if is_gpu_metric(n)}
    if live:
        return live, "the running server (it has a GPU)"
    if GPU_METRICS_PAGE.exists():
        page = promql.exported_metric_names(GPU_METRICS_PAGE.read_text())
        return {n for n in page if is_gpu_metric(n)}, f"{GPU_METRICS_PAGE.relative_to(REPO)}"
    return set(TRITON_GPU_METRICS), "TRITON_GPU_METRICS (Triton's src/metrics.cc), not a GPU"


def test_gpu_metrics_of_the_dashboard_are_verified_only_against_a_gpu_server_or_triton_source(
    exported,
):
    names_used = {n for q in all_queries() for n in promql.metric_names(q.expr) if is_gpu_metric(n)}
    assert {"nv_gpu_utilization", "nv_gpu_memory_used_bytes"} <= names_used
    known, source = gpu_metric_names(exported)
    assert known, f"{source} lists no GPU metric"
    assert names_used <= known, f"not in {source}: {sorted(names_used - known)}"
    if "not a GPU" in source:
        warnings.warn(
            f"GPU panels checked against {source}; verified on a live GPU server only when "
            f"{GPU_METRICS_PAGE.relative_to(REPO)} exists or the server has a GPU",
            UserWarning,
            stacklevel=1,
        )


# --- a real Prometheus evaluates every dashboard query ---------------------------------------


@pytest.fixture(scope="module")
def prometheus(server, gateway_exporter, tmp_path_factory):
    """A Prometheus scraping the test server and the gateway exporter every second, with the
    repository's alert and SLO rules evaluated every second."""
    target = urllib.parse.urlsplit(server.metrics_url)
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "scrape_configs": [
            {
                "job_name": "triton",
                "metrics_path": target.path,
                "static_configs": [{"targets": [target.netloc]}],
            },
            {"job_name": "gateway", "static_configs": [{"targets": [gateway_exporter[1]]}]},
        ],
    }
    rules = {path.name: path.read_text() for path in RULE_FILES}
    with Prometheus(tmp_path_factory.mktemp("prometheus"), config, rules) as process:
        deadline = time.monotonic() + 60
        while not process.query('up{job="triton"} == 1'):
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus did not scrape the server:\n{process.log_tail()}")
            time.sleep(0.5)
        # Traffic spread over several scrapes, so rates and ratios have two samples to work on.
        _, _, access_log, entry = gateway_exporter
        for i in range(6):
            send_traffic(server, repeats=2)
            with access_log.open("a") as f:
                f.write(entry.format("PASSED") + entry.format("REJECTED") * (i % 2))
            time.sleep(SCRAPE_INTERVAL_S)
        yield process


def as_prometheus_query(expr: str) -> str:
    """What Grafana sends: $model at "All" is its allValue .*, intervals are durations."""
    expr = expr.replace("$model", ".*").replace("${model}", ".*")
    return promql.expand_grafana_variables(expr.replace("$__rate_interval", RATE_WINDOW))


def test_every_dashboard_query_returns_data_from_prometheus(prometheus):
    dashboard = json.loads(DASHBOARD.read_text())
    empty, failed = [], {}
    for query in promql.dashboard_queries(dashboard):
        names = promql.metric_names(query.expr)
        try:
            result = prometheus.api("query", query=as_prometheus_query(query.expr))
        except urllib.error.HTTPError as exc:
            failed[query.where] = exc.read().decode()
            continue
        if any(is_gpu_metric(n) for n in names):
            continue  # evaluated without error; no GPU here, so no series to expect
        if not result["data"]["result"]:
            empty.append(query.where)
    assert not failed, failed
    assert not empty, f"no series from Prometheus for {empty}"


# Traffic whose ratios are known by construction: FRESH requests of TEXTS_PER_REQUEST new texts
# each, sent one after another (each is one execute of TEXTS_PER_REQUEST items in each of embed's
# steps: formed batch TEXTS_PER_REQUEST), then every one of them REPEATS more times (a
# response-cache hit each: FRESH misses, FRESH * REPEATS hits); and access log lines of which
# REFUSED of SHAPED are refusals. An inverted or mixed-up formula gives another number.
FRESH, TEXTS_PER_REQUEST, REPEATS = 4, 4, 3
SHAPED, REFUSED = 10, 2
EXPECTED_BATCH = TEXTS_PER_REQUEST
EXPECTED_HIT_RATE = FRESH * REPEATS / (FRESH * REPEATS + FRESH)  # 0.75, 0.25 inverted
EXPECTED_REFUSED_SHARE = REFUSED / SHAPED  # 0.2, 0.8 inverted


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(page: str, name: str) -> list[tuple[dict[str, str], float]]:
    """``name``'s samples on a /metrics page: (labels, value)."""
    found = []
    for line in page.splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1) == name:
            found.append((dict(LABEL.findall(match.group(2) or "")), float(match.group(3))))
    return found


def embed_steps(server) -> list[str]:
    """The models of embed's steps in the server's configs (one, tokenize_encode, for local)."""
    config = model_config.resolve(MODEL_REPOSITORY / "embed", server.config.model_config_name)
    return [step.model_name for step in config.ensemble_scheduling.step]


def counters(server, exporter) -> dict[tuple[str, str], float]:
    """The counters the three ratio panels divide, straight from the two /metrics pages."""
    triton = metrics_page(server)
    found: dict[tuple[str, str], float] = {}
    steps = [
        (n, m)
        for m in embed_steps(server)
        for n in ("nv_inference_count", "nv_inference_exec_count")
    ]
    for name, model in [
        *steps,
        ("nv_cache_num_hits_per_model", "embed"),
        ("nv_cache_num_misses_per_model", "embed"),
    ]:
        found[name, model] = sum(
            v for labels, v in samples(triton, name) if labels["model"] == model
        )
    gateway = generate_latest(exporter.registry).decode()
    for outcome in ("refused", "admitted"):
        found[outcome, "embed"] = sum(
            v
            for labels, v in samples(gateway, "gateway_requests_total")
            if labels["model"] == "embed" and labels["outcome"] == outcome
        )
    return found


def newest_scrape(prometheus: Prometheus, job: str) -> float:
    """Timestamp (s) of the newest scrape of ``job`` that Prometheus has stored, 0 if none."""
    result = prometheus.query(f'timestamp(up{{job="{job}"}})')
    return float(result[0]["value"][1]) if result else 0.0


def scrapes_after(prometheus: Prometheus, moment: float) -> dict[str, float]:
    """Wait until both jobs have a scrape that began after ``moment`` (epoch s); their times."""
    deadline = time.monotonic() + 60
    while True:
        times = {job: newest_scrape(prometheus, job) for job in ("triton", "gateway")}
        if all(t > moment for t in times.values()):
            return times
        assert time.monotonic() < deadline, f"no scrape after {moment}: {times}"
        time.sleep(0.2)


def send_known_traffic(server, access_log: Path, entry: str) -> None:
    fresh = [
        [f"Batch {i} text {j}, {time.monotonic_ns()}." for j in range(TEXTS_PER_REQUEST)]
        for i in range(FRESH)
    ]
    with EmbedClient(server.http_url, "http") as client:
        for texts in fresh:
            client.embed(texts)
        for _ in range(REPEATS):
            for texts in fresh:
                client.embed(texts)
    with access_log.open("a") as f:
        f.write(entry.format("PASSED") * (SHAPED - REFUSED) + entry.format("REJECTED") * REFUSED)


def test_dashboard_ratios_come_out_right_from_prometheus(server, gateway_exporter, prometheus):
    """Formed batch size, cache hit rate and refused share equal what the traffic makes them.

    Each ratio is evaluated over a window holding exactly one scrape before the traffic and one
    after it, so it divides the counters' whole increase over the traffic and nothing else.
    """
    exporter, _, access_log, entry = gateway_exporter
    # Quiet first: no traffic from here on until a scrape of each job has stored the counters.
    while True:
        quiet = time.time()
        before = counters(server, exporter)
        first = scrapes_after(prometheus, quiet)
        if counters(server, exporter) == before:
            break
    send_known_traffic(server, access_log, entry)
    steps = embed_steps(server)
    expected = {
        **{("nv_inference_count", step): FRESH * TEXTS_PER_REQUEST for step in steps},
        **{("nv_inference_exec_count", step): FRESH for step in steps},
        ("nv_cache_num_hits_per_model", "embed"): FRESH * REPEATS,
        ("nv_cache_num_misses_per_model", "embed"): FRESH,
        ("refused", "embed"): REFUSED,
        ("admitted", "embed"): SHAPED - REFUSED,
    }
    # Triton records a request's statistics as it releases it, the exporter reads its log every
    # 0.1 s: wait for both, so that the scrape after ``done`` holds all of it.
    deadline = time.monotonic() + 30
    while True:
        after = counters(server, exporter)
        increase = {k: after[k] - before[k] for k in expected}
        if increase == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert increase == expected, "the traffic did not move the counters as sent"
    done = time.time()
    last = scrapes_after(prometheus, done)

    dashboard = json.loads(DASHBOARD.read_text())
    by_title = {p["title"]: p for p in promql.dashboard_panels(dashboard) if p.get("type") != "row"}

    def values(title: str, job: str) -> dict[str, float]:
        # From 1 ms before the job's first scrape after ``quiet`` to its first after ``done``.
        (target,) = by_title[title]["targets"]
        window_ms = round((last[job] - first[job]) * 1000) + 1
        expr = target["expr"].replace("$__rate_interval", f"{window_ms}ms")
        result = prometheus.api("query", query=as_prometheus_query(expr), time=f"{last[job]:.3f}")
        return {r["metric"].get("model"): float(r["value"][1]) for r in result["data"]["result"]}

    batch = values("Formed batch size", "triton")
    for step in steps:
        assert batch[step] == pytest.approx(EXPECTED_BATCH, rel=1e-3), batch
    hits = values("Response cache hit rate", "triton")
    assert hits["embed"] == pytest.approx(EXPECTED_HIT_RATE, rel=1e-3), hits
    refused = values("Refused share by model", "gateway")
    assert refused["embed"] == pytest.approx(EXPECTED_REFUSED_SHARE, rel=1e-3), refused
