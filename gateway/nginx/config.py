"""The gateway's nginx config: a small typed context, rendered by ``nginx.conf.j2`` beside it.

``render(Gateway(...))`` is the whole config. The context holds values, each computed here
(bucket rates, exact-match patterns, Retry-After per tenant and model); the template holds
the layout: an outline that includes each concern (TLS, shaping, OpenAI's API, the rollout,
each listener) from a part of its own in ``parts/``. ``check_config`` runs ``nginx -t`` on a
rendered config.

    config = Gateway(
        Upstreams(http=("triton-0:8000", "triton-1:8000"), grpc=("triton-0:8001", "triton-1:8001")),
        Listen(http_port=8000, grpc_port=8001, host="0.0.0.0"),
        shaping=Shaping(load_limits("docker/nginx/limits.toml")),
        openai=OpenAI(),
    )
    text = render(config)
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import jinja2

from gateway import shaping
from gateway.nginx import rollout
from gateway.nginx.rollout import Rollout
from gateway.served import SERVED
from gateway.shaping import Limit, Limits
from pipelines import embedding

__all__ = [
    "ACCESS_LOG",
    "ENCODING_REFUSED",
    "OVERLOADED",
    "SCRIPTS",
    "SCRIPTS_DIR",
    "SHADOW_IDLE_S",
    "TLS",
    "USER_ID_HEADER",
    "Clients",
    "Gateway",
    "Listen",
    "OpenAI",
    "Runtime",
    "Shaping",
    "Upstreams",
    "check_config",
    "find_js_module",
    "find_nginx",
    "render",
]

# Beside this module: the container image holds gateway/, not docker/ (.dockerignore).
TEMPLATE = Path(__file__).with_name("nginx.conf.j2")
# The scripts nginx runs (njs), in gateway/ where the deployments copy them from: gRPC routing
# always, OpenAI's API with ``openai``, each request's version with a ``rollout``.
SCRIPTS_DIR = Path(__file__).parents[1]
SCRIPTS = ("grpc.js", "openai.js", "rollout.js")
# The access log: a JSON line per inference request, with shaping or a rollout (its format:
# parts/access_log.j2; gateway/access_log.py counts its lines). Under nginx's prefix.
ACCESS_LOG = "logs/shaping.log"
# Inference over HTTP (the model is in the path); gRPC's is in the body (gateway/grpc.js).
HTTP_INFER = r"^/v2/models/(?<model_name>" + "|".join(SERVED) + r")(/versions/[0-9]+)?/infer$"
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
# Where gateway/openai.js counts an OpenAI call in the buckets (shape, before it parses the
# body) and sends its Triton requests (infer), by OpenAI model id.
OPENAI_INFER = r"^/_openai/(?<model_name>[^/]+)/(shape|infer)$"
OVERLOADED = "too many requests at once from this address: retry after 1 s"
# A body with a Content-Encoding (415): Triton 2.51 inflates one whole, with no bound.
ENCODING_REFUSED = "a compressed request body is not accepted: send it without Content-Encoding"
# The comparator (gateway/shadow.py) closes a connection idle this long; nginx closes its
# pooled ones to it sooner.
SHADOW_IDLE_S = 30
# When no server behind the gateway answers (all down, restarting, or too slow to connect).
UNAVAILABLE = "no inference server answered the gateway: retry after 1 s"
OPERATOR_ONLY = (
    "not served through the gateway: an operator reaches it on Triton directly, with the admin key"
)
UNKNOWN_MODEL = f"unknown model: this gateway serves {', '.join(SERVED)}"
USER_ID_HEADER = "X-User-Id"
INSTALL_HINT = (
    "apt-get install -y --no-install-recommends nginx (Debian 12's nginx 1.22; `make tools`), "
    "or set $NGINX to an nginx binary"
)
# Where the njs module is: Debian's libnginx-mod-http-js, then the official nginx image's.
JS_MODULES = (
    "/usr/lib/nginx/modules/ngx_http_js_module.so",
    "/etc/nginx/modules/ngx_http_js_module.so",
)
JS_INSTALL_HINT = (
    "apt-get install -y --no-install-recommends libnginx-mod-http-js (njs 0.7.9 for Debian 12's "
    "nginx; `make tools`), or give the module's path"
)


def find_nginx() -> str:
    """Path of the nginx binary: ``$NGINX``, PATH, then Debian's ``/usr/sbin/nginx``.

    Raises:
        FileNotFoundError: no nginx; the message says how to install it.
    """
    for candidate in (os.environ.get("NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).exists():
            return candidate
    raise FileNotFoundError(f"nginx not found: {INSTALL_HINT}")


def find_js_module() -> str:
    """Path of nginx's njs module (``$NGINX_JS_MODULE``, then the known places).

    Raises:
        FileNotFoundError: no njs module; the message says how to install it.
    """
    for candidate in (os.environ.get("NGINX_JS_MODULE"), *JS_MODULES):
        if candidate and Path(candidate).exists():
            return candidate
    raise FileNotFoundError(f"nginx's njs module not found: {JS_INSTALL_HINT}")


def operator_network(address: str) -> str:
    """An address or CIDR block for ``allow``, checked (nothing else reaches the config).

    Raises:
        ValueError: not an IPv4 or IPv6 address or network.
    """
    return str(ipaddress.ip_network(address, strict=False))


@dataclass(frozen=True)
class Upstreams:
    """The tritonservers behind the gateway (``host:port`` each), and when nginx skips one.

    Both upstreams are hashed by the ``X-User-Id`` header with consistent hashing, and a request
    that fails on one server is retried on the next.

    Attributes:
        http: the servers' HTTP endpoints.
        grpc: the servers' gRPC endpoints (HTTP/2 cleartext, ``grpc_pass grpc://``).
        max_fails: failures that take a server out of rotation for ``fail_timeout``.
        fail_timeout: how long a failed server stays out before nginx tries it again.
    """

    http: tuple[str, ...]
    grpc: tuple[str, ...]
    max_fails: int = 1
    fail_timeout: str = "2s"

    def __post_init__(self) -> None:
        if not self.http or not self.grpc:
            raise ValueError("an upstream needs at least one server")

    @classmethod
    def of(cls, *servers) -> Upstreams:
        """The upstreams of these servers: each has an ``http_url`` and a ``grpc_url``.

        A running ``server.Server`` has both, so ``Upstreams.of(server)`` puts it behind nginx.
        """
        return cls(tuple(s.http_url for s in servers), tuple(s.grpc_url for s in servers))

    @property
    def tries(self) -> int:
        """Every server once at most: more tries would only come back to a failed one."""
        return max(len(self.http), len(self.grpc))


@dataclass(frozen=True)
class Listen:
    """Where nginx listens: HTTP (the served part of ``/v2/...``) and gRPC (HTTP/2 cleartext).

    A port of 0 is one free at start where ``process.Nginx`` runs it (``render`` writes the
    ports as they are).
    """

    http_port: int = 0
    grpc_port: int = 0
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class Clients:
    """What clients may hold of the gateway, and which of them may read what operators read.

    Attributes:
        max_body: ``client_max_body_size`` of an inference request.
        conns_per_client: requests at once from one client address (HTTP/2 streams count).
        conns: requests at once on each listener, from every client together.
        timeout: how long a client may send nothing (headers, body) or read nothing.
        operators: client addresses or CIDR blocks that may read model configs and statistics
            (perf_analyzer needs both); everyone else gets 403 / PERMISSION_DENIED.
        max_json: the most bytes of an HTTP inference request's JSON (the whole body, or the
            header before binary tensors) that gateway/grpc.js reads for the parameters it
            refuses; more is refused (413). As much as the OpenAI API holds of a call: a batch
            of texts fits, large tensors go as binary data.
    """

    max_body: str = "64m"
    conns_per_client: int = 64
    conns: int = 1024
    timeout: str = "10s"
    operators: tuple[str, ...] = ()
    max_json: int = 4 << 20

    @property
    def allowed(self) -> tuple[str, ...]:
        """The operators as ``allow`` takes them (``operator_network``)."""
        return tuple(operator_network(address) for address in self.operators)


@dataclass(frozen=True)
class Runtime:
    """How nginx itself runs: workers, user, where it finds njs and the scripts and logs.

    Attributes:
        workers: nginx worker processes (``auto``: one per core).
        user: the ``user`` directive (only meaningful when nginx starts as root); None: none.
        js_module: nginx's njs module where nginx runs; None: the one found here.
        js_dir: the folder holding the scripts (``SCRIPTS``), as nginx will see it.
        access_log: where nginx writes the access log, when it writes one
            (``Gateway.access_log``); a relative path is under nginx's prefix.
    """

    workers: int | str = "auto"
    user: str | None = None
    js_module: str | None = None
    js_dir: str = str(SCRIPTS_DIR)
    access_log: str = ACCESS_LOG

    @property
    def load_module(self) -> str:
        """The njs module that nginx loads (``find_js_module`` when none is given)."""
        return self.js_module or find_js_module()


@dataclass(frozen=True)
class Bucket:
    """One token bucket as nginx holds it: a ``limit_req`` zone of its own.

    The zone's key is non-empty only for its own tenant (model), so the zone holds one bucket;
    limit_req does not count requests with an empty key.

    Attributes:
        kind: ``tenant`` or ``model``.
        index: its place among the buckets of its kind (names its key variable).
        name: the tenant's (model's) name.
        limit: its rate and capacity.
    """

    kind: str
    index: int
    name: str
    limit: Limit

    @property
    def variable(self) -> str:
        """The nginx variable that names a request's tenant (model)."""
        return "$tenant" if self.kind == "tenant" else "$triton_model"

    @property
    def key(self) -> str:
        """The zone's key: 1 for this bucket's requests, empty for the others."""
        return f"$shaping_{self.kind}_{self.index}"

    @property
    def zone(self) -> str:
        """The ``limit_req_zone`` name."""
        return f"{self.kind}_{self.name}"

    @property
    def rate(self) -> str:
        """The rate as nginx takes it: whole requests per second, else per minute."""
        if float(self.limit.rate).is_integer():
            return f"{int(self.limit.rate)}r/s"
        return f"{max(1, round(self.limit.rate * 60))}r/m"

    @property
    def burst(self) -> int:
        """The ``burst`` nginx takes: the excess over the one request a bucket always admits."""
        return self.limit.capacity - 1


def exact(key: str) -> str:
    r"""A map source regex that matches ``key`` exactly: nginx compares plain strings ignoring case.

    Every character but letters and digits as a PCRE ``\xHH`` escape, so that none is special
    to PCRE or to nginx's quoting (shaping.KEY already keeps quotes and backslashes out).
    """
    body = "".join(c if c.isascii() and c.isalnum() else f"\\\\x{ord(c):02x}" for c in key)
    return f"~^{body}$"


@dataclass(frozen=True)
class Shaping:
    """Token buckets per tenant and per model (``gateway.shaping`` explains the limits file).

    A request over its tenant's or its model's rate gets HTTP 429 with ``Retry-After`` (gRPC
    ``RESOURCE_EXHAUSTED`` with ``retry-after`` metadata), and every shaped request is a JSON
    line in the access log, which ``python -m gateway.access_log`` turns into Prometheus counters.

    Attributes:
        limits: the buckets, and the header that carries a tenant's API key.
    """

    limits: Limits

    @property
    def header_variable(self) -> str:
        """The nginx variable of the API key's header."""
        return "$http_" + self.limits.header.lower().replace("-", "_")

    @property
    def tenant_keys(self) -> list[tuple[str, str]]:
        """(exact pattern of an API key, its tenant), for every key."""
        return [(exact(key), tenant) for key, tenant in self.limits.keys.items()]

    @property
    def buckets(self) -> list[Bucket]:
        """Every tenant's bucket, then every model's."""
        return [
            *(Bucket("tenant", i, *item) for i, item in enumerate(self.limits.tenants.items())),
            *(Bucket("model", i, *item) for i, item in enumerate(self.limits.models.items())),
        ]

    @property
    def retry_after(self) -> list[tuple[str, int]]:
        """(``$retry_after`` source, seconds until both of a request's buckets gain a token).

        A source is "tenant model", or a tenant's regex for the models without a bucket.
        """
        rows = []
        for tenant, limit in self.limits.tenants.items():
            for model, model_limit in self.limits.models.items():
                rows.append((f"{tenant} {model}", max(limit.retry_after, model_limit.retry_after)))
            rows.append((f"~^{tenant} ", limit.retry_after))
        return rows


@dataclass(frozen=True)
class OpenAI:
    """OpenAI's embeddings API at the gateway (gateway/openai.js), and what it serves.

    Attributes:
        models: OpenAI model id → the Triton ensemble it calls (one that answers TOKENS).
        max_inputs: the most texts one call may carry (more: 413).
        chunk: texts per Triton request (the ensembles' max_batch_size).
        dimensions: the floats of one embedding, which the script checks every answer against.
        max_body: ``client_max_body_size`` of the API, held in memory whole for the script:
            4 MiB is 2048 texts of 2 KiB, over the 256 word pieces the model reads of each
            (OpenAI's own API takes at most 300,000 tokens a call, about 1.2 MB of English).
    """

    models: tuple[tuple[str, str], ...] = tuple(embedding.OPENAI_MODELS.items())
    max_inputs: int = embedding.MAX_OPENAI_INPUTS
    chunk: int = embedding.MAX_TEXTS
    dimensions: int = embedding.HIDDEN_SIZE
    max_body: str = "4m"
    # OpenAI model id → its width, for models whose width is not ``dimensions``.
    widths: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of_repository(cls, repository: Path) -> OpenAI:
        """The repository's own models, and each text service ``python -m export sentence`` made.

        A service's signature.json names its ensemble (the one with TOKENS) and its width.
        """
        models, widths = list(embedding.OPENAI_MODELS.items()), []
        for path in sorted(repository.glob("*/signature.json")):
            served = json.loads(path.read_text()).get("openai")
            if served:
                models.append((path.parent.name, served["ensemble"]))
                widths.append((path.parent.name, int(served["dimensions"])))
        return cls(models=tuple(models), widths=tuple(widths))

    @property
    def ids(self) -> str:
        """The OpenAI model ids, as the script reads them (space-separated)."""
        return " ".join(model for model, _ in self.models)

    @property
    def dimensions_of(self) -> str:
        """Each id's width, ``id:d`` space-separated, as the script reads them."""
        widths = dict(self.widths)
        return " ".join(f"{m}:{widths.get(m, self.dimensions)}" for m, _ in self.models)

    @property
    def too_large(self) -> str:
        """OpenAI's error body for a call over ``max_body``."""
        return json.dumps(
            {
                "error": {
                    "message": f"request body too large: at most {self.max_body}",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "request_too_large",
                }
            }
        )

    @property
    def encoding_refused(self) -> str:
        """OpenAI's error body for a call with a Content-Encoding (415)."""
        return json.dumps(
            {
                "error": {
                    "message": ENCODING_REFUSED,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "unsupported_content_encoding",
                }
            }
        )

    @property
    def internal(self) -> str:
        """The script's own locations (``shape``, ``infer`` follow), by OpenAI model id."""
        return OPENAI_INFER.replace("model_name", "openai_id").replace("(shape|infer)$", "")


@dataclass(frozen=True)
class TLS:
    """Both listeners over TLS (HTTPS, and gRPC over TLS), with this certificate and key.

    With TLS on, the ports speak nothing else: a plain-text client gets nginx's 400 (HTTP) or
    a failed handshake (gRPC). Only TLS 1.2 and 1.3; on 1.2 only ECDHE key exchange with an
    AEAD cipher, so every session has forward secrecy (Mozilla's "intermediate" profile, which
    every client of the last years meets); 1.3's suites are all of that kind.

    Attributes:
        certificate: PEM file: the server's certificate, then any intermediates, as nginx
            reads it where it runs.
        key: PEM file of its private key.
    """

    certificate: str
    key: str
    protocols: str = "TLSv1.2 TLSv1.3"
    ciphers: str = ":".join(
        f"ECDHE-{auth}-{cipher}"
        for cipher in ("AES128-GCM-SHA256", "AES256-GCM-SHA384", "CHACHA20-POLY1305")
        for auth in ("ECDSA", "RSA")
    )


@dataclass(frozen=True)
class Gateway:
    """Everything the nginx config is rendered from.

    Attributes:
        upstreams: the servers behind the gateway.
        listen: where nginx listens (default: ports free at start, on loopback).
        clients: what clients may hold, and the operators' addresses.
        runtime: nginx's workers, user, njs module and scripts.
        shaping: token buckets per tenant and model; None: no shaping.
        openai: serve OpenAI's embeddings API (/v1/embeddings, /v1/models) too; None: not.
        tls: both listeners over TLS only; None: plain HTTP and HTTP/2 cleartext.
        rollout: a share of some models' traffic to canary servers; None: none.
    """

    upstreams: Upstreams
    listen: Listen = Listen()
    clients: Clients = Clients()
    runtime: Runtime = Runtime()
    shaping: Shaping | None = None
    openai: OpenAI | None = None
    tls: TLS | None = None
    rollout: Rollout | None = None

    @property
    def access_log(self) -> str | None:
        """The access log (``Runtime.access_log``), that ``gateway.access_log`` reads; None: none.

        A JSON line per inference request, written with shaping or with a rollout (each line
        names the request's version then).
        """
        if self.shaping is None and self.rollout is None:
            return None
        return self.runtime.access_log


_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATE.parent),
    autoescape=False,  # nginx's syntax, not HTML
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
# The template names the constants it shows as Python names them: this module's (messages,
# patterns, the served models), the anonymous tenant's, and a rollout's versions.
_TEMPLATES.globals.update(
    (name, value)
    for namespace in (globals(), vars(shaping), vars(rollout))
    for name, value in namespace.items()
    if name.isupper() and not isinstance(value, type)
)


def render(gateway: Gateway) -> str:
    """The nginx config of this gateway.

    Raises:
        ValueError: an operator that is no address or network.
    """
    template = _TEMPLATES.get_template(TEMPLATE.name)
    context = {f.name: getattr(gateway, f.name) for f in fields(gateway)}
    return template.render(context, access_log=gateway.access_log)


def check_config(text: str, nginx: str | None = None) -> None:
    """Run ``nginx -t`` on a rendered config, in a throwaway prefix (nothing else is touched).

    Raises:
        ValueError: nginx refused the config; the message is what nginx said.
        FileNotFoundError: no nginx binary.
    """
    binary = nginx or find_nginx()
    with tempfile.TemporaryDirectory(prefix="nginx-check-") as prefix:
        for folder in ("tmp", "logs"):
            Path(prefix, folder).mkdir()
        config = Path(prefix, "nginx.conf")
        config.write_text(text)
        done = subprocess.run(
            [binary, "-t", "-p", f"{prefix}/", "-c", str(config), "-e", "stderr"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    if done.returncode != 0:
        raise ValueError(f"nginx -t refused the config:\n{done.stderr.strip()}")
