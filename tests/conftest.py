"""Shared fixtures: the exported model, sample photos and one real tritonserver per test run."""

from __future__ import annotations

from pathlib import Path

import pytest

from export import samples
from paths import MODEL_REPOSITORY
from pipelines import classification
from server import Server, ServerConfig

CLASSIFIER_ONNX = MODEL_REPOSITORY / classification.CLASSIFIER / "1" / "model.onnx"
ENCODER_ONNX = tuple(MODEL_REPOSITORY / "encoder" / v / "model.onnx" for v in ("1", "2"))


@pytest.fixture(autouse=True)
def _only_integration_tests_start_tritonserver(request, monkeypatch):
    """``pytest -m "not integration"`` must start no tritonserver: a test that does is marked."""
    if request.node.get_closest_marker("integration") is None:

        def refuse(*args, **kwargs):
            raise RuntimeError(f"{request.node.nodeid} starts tritonserver: mark it integration")

        monkeypatch.setattr(Server, "start", refuse)


@pytest.fixture(scope="session")
def nginx_binary() -> str:
    """Debian's nginx with its njs module (every rendered gateway config loads it)."""
    from gateway.nginx.config import find_js_module, find_nginx

    try:
        find_js_module()
        return find_nginx()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc} (`make test` installs both: `make tools`)")


@pytest.fixture(scope="session")
def classifier_onnx() -> Path:
    if not CLASSIFIER_ONNX.exists():
        pytest.fail(f"{CLASSIFIER_ONNX} is missing: run `make models` (make test does)")
    return CLASSIFIER_ONNX


@pytest.fixture(scope="session")
def encoder_onnx() -> tuple[Path, Path]:
    """(fp32, INT8) encoder models."""
    missing = [p for p in ENCODER_ONNX if not p.exists()]
    if missing:
        pytest.fail(f"{missing} missing: run `make models` (make test does)")
    return ENCODER_ONNX


@pytest.fixture(scope="session")
def reference(classifier_onnx):
    """The in-process classify pipeline on onnxruntime: what every served path must match."""
    from bench.harness.reference import ReferenceClassifier

    return ReferenceClassifier(classifier_onnx)


@pytest.fixture(scope="session")
def photos() -> dict[str, bytes]:
    """Every sample photo, JPEG-encoded as a client would send it."""
    return {name: samples.photo_bytes(name) for name in samples.PHOTOS}


@pytest.fixture(scope="session")
def server(classifier_onnx, encoder_onnx, tmp_path_factory) -> Server:
    """One real tritonserver on free loopback ports for the whole run."""
    log_path = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=0)
    with Server(config, log_path=log_path) as running:
        yield running
