"""The gateway over TLS, with real clients and a CA made here: both ports, TLS only.

tritonclient (HTTP and gRPC with ``ssl=True``) and OpenAI's SDK (an ``https`` base URL) that
trust the test's CA are answered; a plain-text client and a client that trusts another CA are
refused; a TLS 1.2 cipher without forward secrecy or an AEAD is refused too.
"""

from __future__ import annotations

import functools
import json
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import gevent.ssl
import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bench.harness.pki import Pki, make_pki
from client.embed import EmbedClient
from gateway.nginx.config import TLS, Gateway, OpenAI, Upstreams
from gateway.nginx.process import Nginx
from pipelines import embedding
from tests.helpers import run_cli

pytestmark = pytest.mark.integration

TEXTS = ["A man is eating food.", "A monkey is playing drums."]


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def gateway(server, pki, tmp_path_factory):
    tls = TLS(str(pki.certificate), str(pki.key))
    log_path = tmp_path_factory.mktemp("tls") / "nginx.log"
    gateway = Gateway(Upstreams.of(server), openai=OpenAI(), tls=tls)
    with Nginx(gateway, log_path=log_path) as nginx:
        yield nginx


@pytest.fixture(scope="module")
def want(server) -> np.ndarray:
    """The vectors of TEXTS, straight from Triton."""
    with EmbedClient(server.http_url, "http") as client:
        return client.embed(TEXTS)


def texts_input(mod):
    tensor = mod.InferInput(embedding.TEXT, [len(TEXTS), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in TEXTS], np.object_).reshape(-1, 1))
    return tensor


def http_client(gateway, ca: Path) -> httpclient.InferenceServerClient:
    context = functools.partial(gevent.ssl.create_default_context, cafile=str(ca))
    return httpclient.InferenceServerClient(gateway.http_url, ssl=True, ssl_context_factory=context)


def grpc_client(gateway, ca: Path) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(gateway.grpc_url, ssl=True, root_certificates=str(ca))


def sdk(gateway, ca: Path) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"https://{gateway.http_url}/v1",
        api_key="unused: this gateway shapes nothing",
        http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(ca))),
        max_retries=0,
    )


@pytest.mark.parametrize("mod", [httpclient, grpcclient], ids=["https", "grpc-tls"])
def test_tritonclient_over_tls_gets_embeds_vectors(gateway, pki, want, mod):
    make = http_client if mod is httpclient else grpc_client
    with make(gateway, pki.ca) as client:
        assert client.is_server_ready()
        result = client.infer(embedding.ENSEMBLE, [texts_input(mod)])
    np.testing.assert_allclose(result.as_numpy(embedding.EMBEDDING), want, atol=1e-6)


def test_openai_sdk_with_an_https_base_url_gets_embeds_vectors(gateway, pki, want):
    result = sdk(gateway, pki.ca).embeddings.create(
        model=embedding.ENSEMBLE, input=TEXTS, encoding_format="float"
    )
    np.testing.assert_allclose([d.embedding for d in result.data], want, atol=1e-6)


def test_a_plain_text_client_is_refused_on_both_ports(gateway):
    with pytest.raises(urllib.error.HTTPError) as plain:
        urllib.request.urlopen(f"http://{gateway.http_url}/v2/health/ready", timeout=10)
    assert plain.value.code == 400
    assert b"plain HTTP request was sent to HTTPS port" in plain.value.read()
    with (
        grpcclient.InferenceServerClient(gateway.grpc_url) as client,
        pytest.raises(InferenceServerException) as cleartext,
    ):
        client.infer(embedding.ENSEMBLE, [texts_input(grpcclient)], client_timeout=10)
    assert cleartext.value.status() == "StatusCode.UNAVAILABLE", cleartext.value


def test_a_client_that_trusts_another_ca_is_refused(gateway, pki):
    with (
        pytest.raises(ssl.SSLCertVerificationError),
        http_client(gateway, pki.other_ca) as client,
    ):
        client.is_server_ready()
    with (
        grpc_client(gateway, pki.other_ca) as client,
        pytest.raises(InferenceServerException) as untrusted,
    ):
        client.infer(embedding.ENSEMBLE, [texts_input(grpcclient)], client_timeout=10)
    assert untrusted.value.status() == "StatusCode.UNAVAILABLE", untrusted.value
    with pytest.raises(openai.APIConnectionError):
        sdk(gateway, pki.other_ca).embeddings.create(model=embedding.ENSEMBLE, input=TEXTS)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_command_line_client_trusts_the_ca_file_it_is_given(gateway, pki, want, protocol):
    url = gateway.http_url if protocol == "http" else gateway.grpc_url
    args = ["embed", *TEXTS, "--url", url, "--protocol", protocol, "--ca-file"]
    done = run_cli(*args, str(pki.ca))
    assert done.returncode == 0, done.stderr
    got = [json.loads(line)["embedding"] for line in done.stdout.splitlines()]
    np.testing.assert_allclose(got, want, atol=1e-6)
    untrusted = run_cli(*args, str(pki.other_ca))
    assert untrusted.returncode == 1 and "cannot reach Triton" in untrusted.stderr, untrusted


def handshake(gateway, pki, context: ssl.SSLContext) -> tuple[str, str]:
    """(protocol, cipher) of a TLS handshake with the gateway's HTTP port."""
    context.load_verify_locations(str(pki.ca))
    host, port = gateway.http_url.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        return tls.version(), tls.cipher()[0]


def test_only_modern_protocols_and_ciphers(gateway, pki):
    assert handshake(gateway, pki, ssl.create_default_context())[0] == "TLSv1.3"
    tls12 = ssl.create_default_context()
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    assert handshake(gateway, pki, tls12) == ("TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256")
    # CBC with SHA-1 MACs: nginx's default ciphers (HIGH:!aNULL:!MD5) take it, these do not.
    cbc = ssl.create_default_context()
    cbc.maximum_version = ssl.TLSVersion.TLSv1_2
    cbc.set_ciphers("ECDHE-ECDSA-AES128-SHA")
    with pytest.raises(ssl.SSLError, match=r"HANDSHAKE_FAILURE|handshake failure"):
        handshake(gateway, pki, cbc)
