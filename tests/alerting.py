"""Debian's Prometheus and Alertmanager as processes of a test, and a webhook that receives.

Each runs from a folder of its own with the configuration the test writes; ``HttpProcess``
gives them a free port, a guard and a clean stop, as it does the server.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from processes.managed import HttpProcess
from tests.helpers import prometheus_tool


def alertmanager_tool() -> str:
    """Path of Debian's ``prometheus-alertmanager`` (``make tools`` installs it)."""
    import pytest

    found = shutil.which("prometheus-alertmanager")
    if not found:
        pytest.fail(
            "prometheus-alertmanager not found: `make tools` installs Debian's package "
            "(apt-get install -y --no-install-recommends prometheus-alertmanager)"
        )
    return found


class Prometheus(HttpProcess):
    """Prometheus with ``config`` (a dict, written to its folder) and these rule files."""

    name = "prometheus"
    ready_path = "/-/ready"

    def __init__(self, folder: Path, config: dict, rules: dict[str, str] | None = None):
        super().__init__()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in (rules or {}).items():
            (folder / name).write_text(text)
        self.config = {**config, "rule_files": sorted(rules or {})}

    def command(self) -> list[str]:
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(self.config))
        return [
            prometheus_tool("prometheus"),
            f"--config.file={self.folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--web.listen-address={self.url}",
        ]

    @property
    def base(self) -> str:
        return f"http://{self.url}"

    def api(self, path: str, **params) -> dict:
        """GET ``/api/v1/<path>`` with ``params``; the decoded JSON."""
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def query(self, expr: str, **params) -> list[dict]:
        """An instant query's result vector."""
        return self.api("query", query=expr, **params)["data"]["result"]


class Alertmanager(HttpProcess):
    """Alertmanager with ``config`` (a dict), alone (no cluster), its state in ``folder``."""

    name = "alertmanager"
    ready_path = "/-/ready"

    def __init__(self, folder: Path, config: dict):
        super().__init__()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.config = config

    def command(self) -> list[str]:
        (self.folder / "alertmanager.yml").write_text(yaml.safe_dump(self.config))
        return [
            alertmanager_tool(),
            f"--config.file={self.folder / 'alertmanager.yml'}",
            f"--storage.path={self.folder / 'data'}",
            f"--web.listen-address={self.url}",
            "--cluster.listen-address=",  # one instance: no gossip port to bind
        ]

    def alerts(self, *matchers: str) -> list[dict]:
        """The alerts it holds (API v2) that match every matcher (``'alertname="X"'``), with
        their ``status``: ``state`` (active, suppressed) and the ``inhibitedBy`` fingerprints."""
        query = urllib.parse.urlencode([("filter", m) for m in matchers])
        url = f"http://{self.url}/api/v2/alerts?{query}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())


class WebhookReceiver:
    """An HTTP server that keeps every Alertmanager notification it receives, by path."""

    def __init__(self):
        received: list[tuple[str, dict]] = []
        self.received = received
        self._changed = threading.Condition()
        changed = self._changed

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with changed:
                    received.append((self.path, json.loads(body)))
                    changed.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):  # quiet: the test prints what matters
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def wait_for(self, matches, timeout: float) -> tuple[str, dict] | None:
        """The first notification ``matches(path, payload)`` accepts, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for path, payload in self.received:
                    if matches(path, payload):
                        return path, payload
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
