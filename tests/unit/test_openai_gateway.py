"""The OpenAI-compatible gateway's config: what nginx -t says of it, and the deployments' renders.

``nginx -t`` loads the njs module and compiles gateway/openai.js, so a rendered config that
passes it has a script nginx can run. Compose and Kubernetes render the config inside this
repository's image, which holds only what the Dockerfile copies: their commands are run here
against a copy of exactly that.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.harness.pki import make_pki
from gateway.nginx import config, rollout
from gateway.shaping import LIMITS, load_limits
from pipelines import embedding
from tests.helpers import REPO, limits_with_secret_keys

UPSTREAMS = config.Upstreams(("127.0.0.1:9",), ("127.0.0.1:10",))
LISTEN = config.Listen(18000, 18001)
IMAGE_MODULE = "/etc/nginx/modules/ngx_http_js_module.so"


@pytest.mark.parametrize("shaped", [False, True], ids=["plain", "shaped"])
def test_the_openai_config_passes_nginx_t(nginx_binary, shaped):
    shaping = config.Shaping(load_limits(LIMITS, placeholders=True)) if shaped else None
    text = config.render(config.Gateway(UPSTREAMS, LISTEN, shaping=shaping, openai=config.OpenAI()))
    config.check_config(text, nginx_binary)
    assert "location = /v1/embeddings" in text and "js_content openai.embeddings;" in text
    assert f'set $openai_models "{" ".join(embedding.OPENAI_MODELS)}";' in text
    # The embedding's size comes from pipelines/embedding.py (and each exported service's from
    # its signature.json): the script does not retype it.
    widths = " ".join(f"{m}:{embedding.HIDDEN_SIZE}" for m in embedding.OPENAI_MODELS)
    assert f'set $openai_dimensions "{widths}";' in text
    assert not re.search(
        rf"\b{embedding.HIDDEN_SIZE}\b", (config.SCRIPTS_DIR / "openai.js").read_text()
    )
    for model, ensemble in embedding.OPENAI_MODELS.items():
        assert f"{model} {ensemble};" in text
    # Shaped, the OpenAI call takes the tenant's and the model's tokens before its body is
    # parsed, at /_openai/<id>/shape.
    assert 'location ~ "^/_openai/(?<openai_id>[^/]+)/shape$" {' in text
    assert 'location ~ "^/_openai/(?<openai_id>[^/]+)/infer$" {' in text
    shape = text.split("internal;")[1].split("}")[0]
    # Not `return 204`: that answers in the rewrite phase, before limit_req counts.
    assert "js_content openai.admitted;" in shape and "return" not in shape
    assert ("limit_req zone=tenant_team-a" in shape) == shaped
    assert ("limit_req zone=model_embed " in shape) == shaped
    assert ("$bearer" in text) == shaped
    # Without limits the script skips the subrequest to the shape location.
    assert ("set $openai_shaping 1;" in text) == shaped


@pytest.mark.parametrize("script", config.SCRIPTS)
def test_nginx_t_compiles_the_scripts_and_refuses_a_broken_one(nginx_binary, tmp_path, script):
    for name in config.SCRIPTS:
        shutil.copy(config.SCRIPTS_DIR / name, tmp_path / name)
    runtime = config.Runtime(js_dir=str(tmp_path))
    canary = rollout.Rollout(("127.0.0.1:19",), ("127.0.0.1:20",))  # rollout.js is read with one
    good = config.render(
        config.Gateway(UPSTREAMS, LISTEN, runtime=runtime, openai=config.OpenAI(), rollout=canary)
    )
    config.check_config(good, nginx_binary)
    broken = (tmp_path / script).read_text().replace("function ", "function (", 1)
    (tmp_path / script).write_text(broken)
    with pytest.raises(ValueError, match="SyntaxError"):
        config.check_config(good, nginx_binary)


def test_without_openai_there_is_no_openai_api(nginx_binary):
    shaping = config.Shaping(load_limits(LIMITS, placeholders=True))
    text = config.render(config.Gateway(UPSTREAMS, LISTEN, shaping=shaping))
    config.check_config(text, nginx_binary)
    assert "js_import grpc from grpc.js;" in text  # gRPC's model routing, always
    assert "js_import openai" not in text and "/v1/" not in text


# The deployments' render commands, inside a copy of the image's files ----------------------------
def image_files(root: Path) -> Path:
    """/opt/app as docker/Dockerfile builds it: the sources it COPYs there (no exported models)."""
    app = root / "opt" / "app"
    app.mkdir(parents=True)
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    for source, target in re.findall(r"^COPY (\S+) /opt/app/(\S*)$", dockerfile, re.M):
        path = REPO / source
        if path.is_dir():
            shutil.copytree(path, app / target, ignore=shutil.ignore_patterns("*.onnx*"))
        else:
            shutil.copy(path, app / target)
    return app


def run_render(
    command: str, tmp_path: Path, binary: str, limits: Path | None = None, tls: bool = False
) -> subprocess.CompletedProcess:
    """Run a deployment's config.render command here, with its paths moved under ``tmp_path``.

    ``limits`` is the file mounted as the limits (default: the committed one with secret keys);
    ``tls`` sets compose's GATEWAY_TLS. Certificates made here stand in for the mounted ones,
    and a config.render that succeeds is checked with ``nginx -t`` (which reads them).
    """
    app = image_files(tmp_path)
    out = tmp_path / "gateway"
    out.mkdir()
    if limits is None:
        limits = limits_with_secret_keys(tmp_path / "limits.toml")
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    here = {  # in this order: /gateway is also part of the limits' path
        "/etc/gateway/limits.toml": str(limits),
        "/run/secrets/gateway_tls_cert": str(pki.certificate),
        "/run/secrets/gateway_tls_key": str(pki.key),
        "/etc/gateway/tls/tls.crt": str(pki.certificate),
        "/etc/gateway/tls/tls.key": str(pki.key),
        "/gateway": str(out),
        IMAGE_MODULE: config.find_js_module(),
        # This environment's Python; `-m` imports from the working directory: the copy.
        "python3 ": f"{shlex.quote(sys.executable)} ",
        # The image's nginx user; this machine's nginx -t runs as whoever runs the tests.
        "--user nginx": "",
        # The Service's name resolves in the cluster (compose's network), not here.
        "triton:": "127.0.0.1:",
    }
    for old, new in here.items():
        command = command.replace(old, new)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GATEWAY_TLS")}
    if tls:
        env["GATEWAY_TLS"] = "on"
    done = subprocess.run(["sh", "-c", command], cwd=app, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return done
    text = (out / "nginx.conf").read_text()
    for script in config.SCRIPTS:
        assert (out / script).read_text() == (config.SCRIPTS_DIR / script).read_text()
    assert f'js_path "{out}";' in text
    assert "limit_req zone=tenant_team-a" in text  # the limits file was read
    config.check_config(text, binary)
    return done


def compose_render() -> str:
    compose = yaml.safe_load((REPO / "docker" / "docker-compose.yml").read_text())
    (command,) = compose["services"]["gateway-config"]["command"]
    assert "--openai" in command and IMAGE_MODULE in command
    return command.replace("$$", "$")  # compose's escape of a shell variable


def kubernetes_render() -> str:
    (deployment,) = [
        doc
        for doc in yaml.safe_load_all((REPO / "docker" / "kubernetes" / "gateway.yaml").read_text())
        if doc["kind"] == "Deployment"
    ]
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    (command,) = init["args"]
    assert init["command"] == ["/bin/sh", "-c"] and "--openai" in command
    # The Secrets are not optional: without them the pod waits instead of serving unshaped, or
    # in plain text.
    secrets = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert {v["secret"]["secretName"] for v in secrets} == {"gateway-limits", "gateway-tls"}
    assert not any(v["secret"].get("optional", False) for v in secrets)
    return command


RENDERS = {"compose": compose_render, "kubernetes": kubernetes_render}


@pytest.mark.parametrize("where", RENDERS)
def test_the_deployments_gateway_renders_from_the_image_alone(nginx_binary, tmp_path, where):
    done = run_render(RENDERS[where](), tmp_path, nginx_binary)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "gateway" / "nginx.conf").read_text()
    # Kubernetes serves TLS only, from its Secret; compose in plain text unless asked.
    tls = where == "kubernetes"
    assert ("listen 0.0.0.0:8080 ssl;" in text) == tls
    assert ("listen 0.0.0.0:8081 ssl http2;" in text) == tls


def test_compose_with_its_tls_file_renders_tls_from_the_mounted_secrets(nginx_binary, tmp_path):
    done = run_render(compose_render(), tmp_path, nginx_binary, tls=True)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "gateway" / "nginx.conf").read_text()
    assert "listen 0.0.0.0:8080 ssl;" in text and "listen 0.0.0.0:8081 ssl http2;" in text
    assert f"ssl_certificate {tmp_path / 'pki' / 'server.pem'};" in text


@pytest.mark.parametrize("where", RENDERS)
def test_the_deployments_gateway_refuses_the_placeholder_keys_and_no_limits(
    nginx_binary, tmp_path, where
):
    done = run_render(RENDERS[where](), tmp_path / "committed", nginx_binary, limits=LIMITS)
    assert done.returncode != 0 and "is the committed placeholder" in done.stderr
    done = run_render(RENDERS[where](), tmp_path / "none", nginx_binary, limits=tmp_path / "absent")
    assert done.returncode != 0 and "absent" in done.stderr
