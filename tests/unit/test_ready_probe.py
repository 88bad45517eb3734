"""The readiness probe tells ready, alive but not ready, and silent apart.

``is_ready`` gates a start; ``answers`` is what the perf harness's watch asks during a case,
where a server answering "not ready" must be left to its case and only silence ends it.
"""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from processes.managed import ManagedProcess


class Probe(ManagedProcess):
    """Only the probe of a managed process, pointed at ``url``."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url

    @property
    def ready_url(self) -> str:
        return self.url


@pytest.fixture
def status_server():
    """An HTTP server on a free port whose readiness answer is ``server.status``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(self.server.status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("status", "ready"), [(200, True), (503, False), (400, False)])
def test_any_answer_is_alive_and_only_200_is_ready(status_server, status, ready):
    status_server.status = status
    probe = Probe(f"http://127.0.0.1:{status_server.server_port}/v2/health/ready")
    assert probe.answers(timeout_s=5)
    assert probe.is_ready(timeout_s=5) is ready


def test_a_listener_that_never_answers_is_silent():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # the kernel accepts the connection; nothing ever reads or writes
        probe = Probe(f"http://127.0.0.1:{listener.getsockname()[1]}/v2/health/ready")
        assert not probe.answers(timeout_s=0.5)
        assert not probe.is_ready(timeout_s=0.5)


def test_a_closed_port_is_silent():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        probe = Probe(f"http://127.0.0.1:{port}/v2/health/ready")
        assert not probe.answers(timeout_s=2)
        assert not probe.is_ready(timeout_s=2)
