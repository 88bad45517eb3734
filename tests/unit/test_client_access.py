"""The client's access to a gateway: the tenant key and the TLS CA, from the command line.

Over the wire (a real gateway that shapes by key and one that speaks TLS only):
tests/integration/test_shaping.py and test_gateway_tls.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient._request import Request

from bench.harness.pki import make_pki
from client import connection
from gateway import shaping
from paths import REPO_ROOT

KEY = "tenant-key-0001"


def parse(argv: list[str]) -> connection.Access:
    parser = argparse.ArgumentParser()
    connection.Access.add_arguments(parser)
    return connection.Access.from_arguments(parser.parse_args(argv))


def test_the_key_goes_in_the_header_the_gateway_reads():
    assert shaping.DEFAULT_HEADER.lower() == connection.API_KEY_HEADER


def test_the_key_comes_from_the_environment_unless_the_flag_gives_one(monkeypatch, tmp_path):
    monkeypatch.delenv(connection.API_KEY_ENV, raising=False)
    assert parse([]) == connection.Access()
    monkeypatch.setenv(connection.API_KEY_ENV, KEY)
    assert parse([]) == connection.Access(api_key=KEY)
    assert parse(["--api-key", "other"]).api_key == "other"
    monkeypatch.setenv(connection.API_KEY_ENV, "")
    assert parse([]).api_key is None
    assert parse(["--ca-file", str(tmp_path / "ca.pem")]).ca_file == tmp_path / "ca.pem"


@pytest.mark.parametrize("protocol", connection.PROTOCOLS)
def test_every_request_of_a_client_carries_the_key(protocol):
    with connection.ModelClient("127.0.0.1:1", protocol, "embed") as anonymous:
        assert anonymous._client.plugin() is None
    access = connection.Access(api_key=KEY)
    with connection.ModelClient("127.0.0.1:1", protocol, "embed", access=access) as client:
        # tritonclient hands every call's headers (HTTP) or metadata (gRPC) to its plugin.
        request = Request({"other": "kept"})
        client._client.plugin()(request)
    assert request.headers == {"other": "kept", "x-api-key": KEY}


def test_a_ca_file_makes_each_protocol_speak_tls_and_trust_that_ca(tmp_path):
    pki = make_pki(tmp_path)
    access = connection.Access(ca_file=pki.ca)
    assert connection.Access().client_options(httpclient) == {}
    http = access.client_options(httpclient)
    contexts = [http["ssl_context_factory"](), access.client_options(aiohttpclient)["ssl_context"]]
    for context in contexts:
        trusted = [dict(item[0] for item in ca["subject"]) for ca in context.get_ca_certs()]
        assert trusted == [{"commonName": "gateway test CA"}]
    assert http["ssl"] is True
    assert access.client_options(grpcclient) == {"ssl": True, "root_certificates": str(pki.ca)}
    # The clients take them as they are.
    httpclient.InferenceServerClient("127.0.0.1:1", **http).close()
    grpcclient.InferenceServerClient("127.0.0.1:1", **access.client_options(grpcclient)).close()


def test_the_command_line_names_a_missing_ca_file_and_never_prints_the_key(tmp_path):
    env = {**os.environ, connection.API_KEY_ENV: KEY}
    missing = tmp_path / "ca.pem"
    done = subprocess.run(
        [sys.executable, "-m", "client", "embed", "a text", "--ca-file", str(missing)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"error: CA file {missing} does not exist"
    shown = subprocess.run(
        [sys.executable, "-m", "client", "embed", "--help"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "--api-key" in shown and "--ca-file" in shown and KEY not in shown
