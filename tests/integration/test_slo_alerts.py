"""A server killed under load pages within 5 minutes, and its first start pages nobody.

All real processes: a tritonserver serving ``classify``; nginx in front of it with token buckets
and its access log, and the gateway's exporter (``gateway/access_log.py``) counting that log;
Debian's Prometheus scraping both every second with the repository's rules (``alerts.yml`` and
the SLO rules of ``slos.yml``) at 1/SCALE of their windows and ``for``; Debian's Alertmanager
with the repository's routing and inhibition (its receivers pointed at a webhook this test
runs, its waits cut to 1 s).

Prometheus watches the server from before it starts: a first start longer than TritonDown's
(scaled) ``for`` pages nobody. Then an open-loop load goes through the gateway, and the server
is SIGKILLed: TritonDown must reach the ``page`` receiver within 5 minutes of rule time; the
gateway keeps answering (502/503), and those answers, which Triton's own counters never see,
burn classify's availability objective until ``SLOAvailabilityFastBurn`` fires, and
Alertmanager holds it back behind TritonDown. Once the server is started again, the page
resolves.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import replace

import pytest
import yaml
from prometheus_client import start_http_server

from bench import overload
from gateway import shaping
from gateway.access_log import AccessLogExporter
from gateway.nginx.config import Gateway, Shaping, Upstreams
from gateway.nginx.process import Nginx
from monitoring import slo
from paths import DOCKER
from pipelines import classification
from server import Server
from server.launcher import free_port
from tests.alerting import Alertmanager, Prometheus, WebhookReceiver

pytestmark = pytest.mark.integration

# An hour of the real rules is 3 minutes here: TritonDown's 2-minute `for` is 6 s, and the
# 5 minutes within which it must page are 15 s. (At 1/60 they would be 5 s, most of which
# this test's own 1-second scrape, evaluation and group wait take.)
SCALE = 20
PAGE_WITHIN_S = slo.seconds("5m") / SCALE
DOWN = "TritonDown"
BURN = "SLOAvailabilityFastBurn"
SLO = f"{classification.ENSEMBLE}-{slo.AVAILABILITY}"
# Well under what the server serves on its one core; long enough before the kill for the
# objective's floor of requests (min_requests in its long window), and on after it until the
# page and the held-back burn alert are seen.
RATE, BEFORE_KILL_S, LOAD_S = 20.0, 6.0, 30.0
SERVER_CPUS = [1]  # the load, the gateway and the monitoring keep the other core
# Nothing here is refused: every request is the anonymous tenant's.
LIMITS = shaping.parse_limits({"anonymous": {"rate": 1000, "capacity": 1000}})
# alerts.yml as this test's Prometheus loads it.
ALERTS = slo.scaled(yaml.safe_load((DOCKER / "prometheus" / "alerts.yml").read_text()), SCALE)
(DOWN_RULE,) = [r for g in ALERTS["groups"] for r in g["rules"] if r.get("alert") == DOWN]
DOWN_FOR_S = slo.seconds(DOWN_RULE["for"])


def scaled_rules() -> dict[str, str]:
    """The rule files of compose's Prometheus, at 1/SCALE of their windows and ``for``."""
    return {
        "alerts.yml": slo.dump(ALERTS),
        "slo-rules.yml": slo.dump(slo.render(slo.load(), scale=SCALE)),
    }


def alertmanager_config(webhook: WebhookReceiver) -> dict:
    """The repository's Alertmanager config, its receivers sent here and its waits cut to 1 s."""
    config = yaml.safe_load((DOCKER / "alertmanager" / "alertmanager.yml").read_text())
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = webhook.url(f"/{receiver['name']}")
    config["route"].update(group_wait="1s", group_interval="1s")
    return config


def prometheus_config(triton: str, gateway: str, manager: Alertmanager) -> dict:
    """Scrape Triton and the gateway's exporter and evaluate every second; alerts to ``manager``."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "triton", "static_configs": [{"targets": [triton]}]},
            {"job_name": "gateway", "static_configs": [{"targets": [gateway]}]},
        ],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [manager.url]}]}]},
    }


def paged(alertname: str, status: str = "firing"):
    def matches(path: str, payload: dict) -> bool:
        return path == "/page" and any(
            a["status"] == status and a["labels"].get("alertname") == alertname
            for a in payload["alerts"]
        )

    return matches


def wait_until(check, timeout: float, what: str):
    """``check()``'s first true value, polled every 0.5 s; fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.5)
    return found


@contextlib.contextmanager
def gateway_metrics(nginx: Nginx):
    """The gateway's exporter following nginx's access log, served on a free port."""
    port = free_port()
    with AccessLogExporter(nginx.access_log, interval=0.1) as exporter:
        http_server, thread = start_http_server(port, "127.0.0.1", registry=exporter.registry)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            http_server.shutdown()
            thread.join(timeout=5)


def alerts_in(prom: Prometheus, alertname: str, since_s: float) -> list[dict]:
    """Every series of ``alertname`` (pending or firing) Prometheus held in the last ``since_s``."""
    window = f"{max(1, round(since_s))}s"
    return prom.query(f'max_over_time(ALERTS{{alertname="{alertname}"}}[{window}])')


def test_a_killed_server_pages_within_5_minutes_and_its_first_start_pages_nobody(
    tmp_path, classifier_onnx
):
    service = overload.SERVICES["classify"]
    # Ports fixed before the start: nginx and Prometheus point at the server before it listens.
    config = replace(
        overload.server_config(service, cpus=SERVER_CPUS),
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
    )
    server = Server(config, log_path=tmp_path / "triton.log")
    outcomes: list = []
    with contextlib.ExitStack() as stack:
        webhook = stack.enter_context(WebhookReceiver())
        manager = stack.enter_context(
            Alertmanager(tmp_path / "alertmanager", alertmanager_config(webhook))
        )
        gateway = Gateway(Upstreams.of(server), shaping=Shaping(LIMITS))
        nginx = stack.enter_context(Nginx(gateway, log_path=tmp_path / "nginx.log"))
        exporter = stack.enter_context(gateway_metrics(nginx))
        triton = f"127.0.0.1:{config.metrics_port}"
        prom = stack.enter_context(
            Prometheus(
                tmp_path / "prometheus",
                prometheus_config(triton, exporter, manager),
                scaled_rules(),
            )
        )
        # The first start: the endpoint down for longer than TritonDown's `for` before it ever
        # answers, however fast the server comes up.
        wait_until(lambda: prom.query('up{job="triton"} == 0'), 30, "a scrape of no server")
        time.sleep(DOWN_FOR_S + 1)
        started = time.monotonic()
        stack.enter_context(server)
        wait_until(lambda: prom.query('up{job="triton"} == 1'), 30, "a scrape of the server")
        up_s = time.monotonic() - started
        load = threading.Thread(
            target=lambda: outcomes.extend(
                overload.overload(nginx.grpc_url, service, RATE, LOAD_S, 10.0)[0]
            )
        )
        load.start()
        stack.callback(load.join)
        time.sleep(BEFORE_KILL_S)
        # Each gRPC answer is logged with its grpc-status (Triton's trailer: 0 for a result),
        # which tells the exporter a failed one from a good one.
        assert '"grpc_status":"0"' in nginx.access_log.read_text()
        first_start = alerts_in(prom, DOWN, time.monotonic() - started + DOWN_FOR_S + 1)
        assert first_start == [] and webhook.received == [], (first_start, webhook.received)

        killed = server.kill()
        page = webhook.wait_for(paged(DOWN), timeout=PAGE_WITHIN_S + 30)
        page_s = time.monotonic() - killed
        assert page is not None, prom.query(f'ALERTS{{alertname="{DOWN}"}}')
        # The gateway's 502/503 are the objective's errors, with no Triton series to count them.
        burn = wait_until(
            lambda: prom.query(f'ALERTS{{alertname="{BURN}",slo="{SLO}",alertstate="firing"}}'),
            30,
            f"{BURN} firing on the gateway's answers",
        )
        ratio = prom.query(f'slo:sli_error:ratio_rate5m{{slo="{SLO}"}}')
        # Alertmanager has it, and holds it back behind TritonDown (docker/alertmanager's
        # inhibition): the page for the cause, not one for each symptom.
        held = wait_until(
            lambda: [
                a for a in manager.alerts(f'alertname="{BURN}"') if a["status"]["inhibitedBy"]
            ],
            30,
            f"{BURN} held back by {DOWN}",
        )
        # The server back (its ports as before): the page resolves.
        server.start()
        back = time.monotonic()
        resolved = webhook.wait_for(paged(DOWN, "resolved"), timeout=60)
        print(
            f"server up {up_s:.1f} s after its first start; {DOWN} paged {page_s:.1f} s after "
            f"the kill, resolved {time.monotonic() - back:.1f} s after the restart; error ratio "
            f"over the short window {ratio[0]['value'][1] if ratio else None}"
        )
        assert resolved is not None, prom.query(f'ALERTS{{alertname="{DOWN}"}}')
    assert page_s <= PAGE_WITHIN_S, f"{DOWN} paged {page_s:.1f} s after the kill"
    _, payload = page
    assert payload["receiver"] == "page" and payload["status"] == "firing"
    (alert,) = [a for a in payload["alerts"] if a["labels"]["alertname"] == DOWN]
    assert alert["labels"]["instance"] == triton and alert["labels"]["service"] == "triton"
    assert burn[0]["metric"]["model"] == classification.ENSEMBLE
    assert held[0]["labels"]["slo"] == SLO
    # Before the kill the gateway answered; after it, it failed what it could not pass on.
    answered = [o for o in outcomes if o.sent_at < killed and o.latency_s is not None]
    assert answered and all(o.ok for o in answered if o.sent_at + o.latency_s < killed)
    assert any(o.error for o in outcomes if o.sent_at > killed + 1)
