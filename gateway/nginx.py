"""nginx in front of several tritonservers: the config and a managed nginx process.

The config comes from ``gateway/nginx.conf.template``: an HTTP upstream over the servers'
HTTP ports and a gRPC upstream (HTTP/2 cleartext, ``grpc_pass grpc://``) over their gRPC ports,
both hashed by the ``X-User-Id`` header with consistent hashing, retried on the next server
when one fails. ``Nginx`` runs Debian's nginx as the current user from a temp prefix (pid,
temp files and config there, nothing under /etc or /var), for the tests and for local use.

Render a config for N containers:
    python -m gateway.nginx render --http triton-0:8000 --http triton-1:8000 \
        --grpc triton-0:8001 --grpc triton-1:8001 --host 0.0.0.0 \
        --limits docker/nginx/limits.toml > nginx.conf

Only what a tenant needs is passed on: health, the server's metadata, and the metadata,
readiness and inference of the served models (``SERVED``). The operator APIs (model control,
shared memory, logging, trace) and each model's config and statistics are refused (HTTP 403,
gRPC ``PERMISSION_DENIED``; ``--operator`` lets some addresses read configs and statistics,
which perf_analyzer needs), the other models, steps of the served ones, are unknown (404,
``NOT_FOUND``), streaming inference is ``UNIMPLEMENTED``, and a client's admin key is never
forwarded. gRPC names the model inside the body: ``gateway/grpc.js`` (njs) reads it there.
Slow and greedy clients meet ``limit_conn`` per address, timeouts on headers and bodies, and
bounded buffers (docs/operations.md#security).

With ``--limits``, inference requests are shaped by token buckets per tenant and per model
(``gateway/shaping.py`` explains the file): a request over its tenant's or its model's rate
gets HTTP 429 with ``Retry-After`` (gRPC ``RESOURCE_EXHAUSTED`` with ``retry-after`` metadata),
and every shaped request is a JSON line in the shaping log, which
``python -m gateway.metrics`` turns into Prometheus counters.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.shaping import ANONYMOUS, Limit, Limits, load_limits
from paths import REPO_ROOT
from pipelines import classification, embedding
from processes.managed import ManagedProcess

__all__ = [
    "LIMITS",
    "SHAPING_LOG",
    "TEMPLATE",
    "Nginx",
    "OpenAI",
    "check_config",
    "find_nginx",
    "render",
]

# Beside this module: the container image holds gateway/, not docker/ (.dockerignore).
TEMPLATE = Path(__file__).with_name("nginx.conf.template")
LIMITS = REPO_ROOT / "docker" / "nginx" / "limits.toml"
# One JSON line per shaped request (gateway/metrics.py counts them), under the prefix.
SHAPING_LOG = "logs/shaping.log"
# The models clients may call through the gateway; the others are their steps.
SERVED = (*classification.SERVED, *embedding.SERVED)
# Inference over HTTP (the model is in the path); gRPC's is in the body (gateway/grpc.js).
HTTP_INFER = r"^/v2/models/(?<model_name>{models})(/versions/[0-9]+)?/infer$"
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
# Where gateway/openai.js counts an OpenAI call in the buckets (shape, before it parses the
# body) and sends its Triton requests (infer), by OpenAI model id.
OPENAI_INFER = r"^/_openai/(?<model_name>[^/]+)/(shape|infer)$"
OVERLOADED = "too many requests at once from this address: retry after 1 s"
# When no server behind the gateway answers (all down, restarting, or too slow to connect).
UNAVAILABLE = "no inference server answered the gateway: retry after 1 s"
# What a location with error_page lines of its own adds, to keep nginx's own errors JSON
# (limit_conn's refusal, and 502/504 when no server answers).
KEEP_OVERLOADED = (
    "            error_page 503 = @overloaded;\n            error_page 502 504 = @unavailable;"
)
OPERATOR_ONLY = (
    "not served through the gateway: an operator reaches it on Triton directly, with the admin key"
)
# The scripts nginx runs (njs): gRPC routing always, OpenAI's API with --openai.
SCRIPTS = ("grpc.js", "openai.js")
INSTALL_HINT = (
    "apt-get install -y --no-install-recommends nginx (Debian 12's nginx 1.22; `make tools`), "
    "or set $NGINX to an nginx binary"
)
USER_ID_HEADER = "X-User-Id"
OPENAI_SCRIPT = Path(__file__).with_name("openai.js")
# Where the njs module is: Debian's libnginx-mod-http-js, then the official nginx image's.
JS_MODULES = (
    "/usr/lib/nginx/modules/ngx_http_js_module.so",
    "/etc/nginx/modules/ngx_http_js_module.so",
)
JS_INSTALL_HINT = (
    "apt-get install -y --no-install-recommends libnginx-mod-http-js (njs 0.7.9 for Debian 12's "
    "nginx; `make tools`), or give the module's path"
)


def find_js_module() -> str:
    """Path of nginx's njs module (``$NGINX_JS_MODULE``, then the known places).

    Raises:
        FileNotFoundError: no njs module; the message says how to install it.
    """
    for candidate in (os.environ.get("NGINX_JS_MODULE"), *JS_MODULES):
        if candidate and Path(candidate).exists():
            return candidate
    raise FileNotFoundError(f"nginx's njs module not found: {JS_INSTALL_HINT}")


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


def find_nginx() -> str:
    """Path of the nginx binary: ``$NGINX``, PATH, then Debian's ``/usr/sbin/nginx``.

    Raises:
        FileNotFoundError: no nginx; the message says how to install it.
    """
    for candidate in (os.environ.get("NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).exists():
            return candidate
    raise FileNotFoundError(f"nginx not found: {INSTALL_HINT}")


def _servers(addresses: Sequence[str], max_fails: int, fail_timeout: str) -> str:
    if not addresses:
        raise ValueError("an upstream needs at least one server")
    return "\n".join(
        f"        server {a} max_fails={max_fails} fail_timeout={fail_timeout};" for a in addresses
    )


def _rate(limit: Limit) -> str:
    # nginx takes whole requests per second or per minute.
    if float(limit.rate).is_integer():
        return f"{int(limit.rate)}r/s"
    return f"{max(1, round(limit.rate * 60))}r/m"


def _zones(kind: str, variable: str, limits: dict[str, Limit]) -> tuple[list[str], list[str]]:
    """A zone per bucket, and the ``limit_req`` lines that apply them.

    Each zone's key is non-empty only for its own tenant (model), so it holds one bucket;
    limit_req does not count requests with an empty key.
    """
    defs, uses = [], []
    for i, (name, limit) in enumerate(limits.items()):
        key = f"$shaping_{kind}_{i}"
        defs += [
            f"    map {variable} {key} {{",
            f'        "{name}" 1;',
            '        default "";',
            "    }",
            f"    limit_req_zone {key} zone={kind}_{name}:1m rate={_rate(limit)};",
        ]
        # nginx's burst is the excess over the one request a bucket always admits (and it
        # refuses burst=0, its default).
        burst = f" burst={limit.capacity - 1}" if limit.capacity > 1 else ""
        uses.append(f"limit_req zone={kind}_{name}{burst} nodelay;")
    return defs, uses


def _retry_after(limits: Limits) -> list[str]:
    """``$retry_after``: seconds until both of a request's buckets gain a token."""
    lines = ['    map "$tenant $triton_model" $retry_after {']
    for tenant, limit in limits.tenants.items():
        for model, model_limit in limits.models.items():
            seconds = max(limit.retry_after, model_limit.retry_after)
            lines.append(f'        "{tenant} {model}" {seconds};')
        lines.append(f'        "~^{tenant} " {limit.retry_after};')
    lines += ["        default 1;", "    }"]
    return lines


def _exact(key: str) -> str:
    r"""A map source that matches ``key`` exactly: nginx compares plain strings ignoring case.

    Every character but letters and digits as a PCRE ``\xHH`` escape, so that none is special
    to PCRE or to nginx's quoting (shaping.KEY already keeps quotes and backslashes out).
    """
    body = "".join(c if c.isascii() and c.isalnum() else f"\\\\x{ord(c):02x}" for c in key)
    return f'"~^{body}$"'


def shaping(
    limits: Limits, grpc_port: int, log_path: str = SHAPING_LOG, openai: bool = False
) -> dict[str, str]:
    """The template's shaping fields: zones and maps, and what the shaped locations hold.

    With ``openai``, an OpenAI call's model is the id the API's script sets.
    """
    header = "$http_" + limits.header.lower().replace("-", "_")
    tenant_defs, tenant_uses = _zones("tenant", "$tenant", dict(limits.tenants))
    model_defs, model_uses = _zones("model", "$triton_model", dict(limits.models))
    keys = [f"        {_exact(key)} {tenant};" for key, tenant in limits.keys.items()]
    http = [
        "",
        "    # Traffic shaping (limits.toml): a token bucket per tenant and one per model.",
        f"    # The API key: the {limits.header} header, else an OpenAI client's bearer token.",
        "    map $http_authorization $bearer_key {",
        r'        "~^Bearer\s+(?<bearer>\S+)$" $bearer;',
        '        default "";',
        "    }",
        f"    map {header} $api_key {{",
        '        "" $bearer_key;',
        f"        default {header};",
        "    }",
        # Regular expressions, case-sensitive: nginx compares a map's plain strings ignoring
        # case, and a key is compared exactly, as gateway.shaping does.
        "    map $api_key $tenant {",
        f"        default {ANONYMOUS};",
        *keys,
        "    }",
        # A gRPC request's model is what gateway/grpc.js read from its body. An OpenAI call is
        # counted at /_openai/<id>/shape and logged as the call itself, under the model id the
        # script sets ($openai_model).
        "    map $uri $triton_model {",
        f'        "~{HTTP_INFER.format(models="|".join(SERVED))}" $model_name;',
        f'        "{GRPC_INFER}" $grpc_model;',
        f'        "~{OPENAI_INFER}" $model_name;',
        *(['        "/v1/embeddings" $openai_model;'] if openai else []),
        '        default "";',
        "    }",
        '    map "$server_port $uri" $shaping_protocol {',
        f'        "~^{grpc_port} " grpc;',
        '        "~ /(v1|_openai)/" openai;',
        "        default http;",
        "    }",
        *tenant_defs,
        *model_defs,
        *_retry_after(limits),
        "    limit_req_status 429;",
        # A refusal is routine here, not an error for the error log.
        "    limit_req_log_level info;",
        '    log_format shaping escape=json \'{"msec":"$msec","tenant":"$tenant",\'',
        '        \'"model":"$triton_model","protocol":"$shaping_protocol",\'',
        '        \'"limit":"$limit_req_status","status":"$status",\'',
        # Seconds with millisecond resolution; upstream: "" when refused before it, and
        # "a, b" when nginx tried a second server (gateway.metrics adds them up).
        '        \'"request_time":"$request_time","upstream_time":"$upstream_response_time"}\';',
        "",
    ]
    buckets = [
        *(f"            {use}" for use in (*tenant_uses, *model_uses)),
        "            error_page 429 = @refused;",
    ]
    shaped = [*buckets, f"            access_log {log_path} shaping;"]
    refused_http = [
        "",
        "        location @refused {",
        f"            access_log {log_path} shaping;",
        "            add_header Retry-After $retry_after always;",
        '            return 429 \'{"error":"rate limit exceeded for tenant $tenant: '
        "retry after $retry_after s\"}';",
        "        }",
    ]
    # A gRPC error is a trailers-only response: grpc-status 8 is RESOURCE_EXHAUSTED.
    refused_grpc = [
        "        location @refused {",
        f"            access_log {log_path} shaping;",
        "            default_type application/grpc;",
        "            add_header grpc-status 8 always;",
        '            add_header grpc-message "rate limit exceeded for tenant $tenant: '
        'retry after $retry_after s" always;',
        "            add_header retry-after $retry_after always;",
        "            return 204;",
        "        }",
    ]
    return {
        "@SHAPING@": "\n".join(http),
        "@HTTP_SHAPED@": "\n".join([*shaped, KEEP_OVERLOADED]),
        "@HTTP_REFUSED@": "\n".join(refused_http),
        "@GRPC_SHAPED@": "\n".join(shaped),
        "@GRPC_REFUSED@": "\n".join(refused_grpc),
        # The shape location logs nothing: /v1/embeddings logs the call.
        "@OPENAI_SHAPED@": "\n".join(buckets),
        # The call's log line, and the script's cue to take the buckets' tokens first (a
        # subrequest: without limits it is skipped).
        "@OPENAI_SHAPING@": f"            access_log {log_path} shaping;\n"
        "            set $openai_shaping 1;",
    }


def openai_fields(openai: OpenAI | None) -> dict[str, str]:
    """The template's fields of the OpenAI-compatible API (empty ones without it)."""
    if openai is None:
        return {"@OPENAI_HTTP@": "", "@OPENAI@": "", "@OPENAI_PATHS@": ""}
    ids = " ".join(model for model, _ in openai.models)
    too_large = json.dumps(
        {
            "error": {
                "message": f"request body too large: at most {openai.max_body}",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_too_large",
            }
        }
    )
    triton = [f"        {model} {ensemble};" for model, ensemble in openai.models]
    http = [
        "",
        "    # OpenAI's embeddings API (gateway/openai.js): /v1/embeddings and /v1/models.",
        "    js_import openai from openai.js;",
        "    js_var $openai_model;",
        "    map $openai_id $openai_triton {",
        *triton,
        '        default "";',
        "    }",
    ]
    internal = OPENAI_INFER.replace("model_name", "openai_id").replace("(shape|infer)$", "")
    api = [
        "",
        "        # OpenAI's embeddings API: the script turns a call into Triton requests below.",
        "        location = /v1/embeddings {",
        f'            set $openai_models "{ids}";',
        f"            set $openai_max_inputs {openai.max_inputs};",
        f"            set $openai_chunk {openai.chunk};",
        f"            set $openai_dimensions {openai.dimensions};",
        # The script reads the body from memory: it must never go to a temp file.
        f"            client_max_body_size {openai.max_body};",
        f"            client_body_buffer_size {openai.max_body};",
        "            error_page 413 = @openai_too_large;",
        KEEP_OVERLOADED,
        "@OPENAI_SHAPING@",
        "            js_content openai.embeddings;",
        "        }",
        "        location @openai_too_large {",
        f"            return 413 '{too_large}';",
        "        }",
        "        location = /v1/models {",
        f'            set $openai_models "{ids}";',
        "            js_content openai.models;",
        "        }",
        # A call's buckets count here, before the script parses its body; nginx counts a
        # request once, so the Triton requests below are not counted again.
        f'        location ~ "{internal}shape$" {{',
        "            internal;",
        "@OPENAI_SHAPED@",
        "            js_content openai.admitted;",
        "        }",
        f'        location ~ "{internal}infer$" {{',
        "            internal;",
        # The script wrote this request whole: none of the caller's headers belong on it (an
        # Inference-Header-Content-Length or Content-Encoding of theirs would make Triton read
        # the JSON as something else, a key would leak), so only these go.
        "            proxy_pass_request_headers off;",
        '            proxy_set_header Connection "";',
        "            proxy_set_header Content-Type application/json;",
        # The whole answer of one Triton request (`chunk` texts of `dimensions` floats and a
        # JSON header).
        "            subrequest_output_buffer_size 1m;",
        "            proxy_pass http://triton_http/v2/models/$openai_triton/infer;",
        "        }",
    ]
    return {
        "@OPENAI_HTTP@": "\n".join(http),
        "@OPENAI@": "\n".join(api),
        "@OPENAI_PATHS@": " and /v1 (OpenAI embeddings)",
    }


SHAPING_FIELDS = (
    "@SHAPING@",
    "@HTTP_SHAPED@",
    "@HTTP_REFUSED@",
    "@GRPC_SHAPED@",
    "@GRPC_REFUSED@",
    "@OPENAI_SHAPED@",
    "@OPENAI_SHAPING@",
)


def render(
    http_upstreams: Sequence[str],
    grpc_upstreams: Sequence[str],
    http_port: int,
    grpc_port: int,
    host: str = "127.0.0.1",
    workers: int | str = "auto",
    max_body: str = "64m",
    max_fails: int = 1,
    fail_timeout: str = "2s",
    user: str | None = None,
    template: Path = TEMPLATE,
    limits: Limits | None = None,
    shaping_log: str = SHAPING_LOG,
    openai: OpenAI | None = None,
    js_module: str | None = None,
    js_dir: str = str(OPENAI_SCRIPT.parent),
    conns_per_client: int = 64,
    conns: int = 1024,
    client_timeout: str = "10s",
    operators: Sequence[str] = (),
) -> str:
    """The nginx config for these upstreams (``host:port`` each) and listen ports.

    Args:
        http_upstreams: the servers' HTTP endpoints.
        grpc_upstreams: the servers' gRPC endpoints.
        http_port: where nginx listens for HTTP (the served part of ``/v2/...``).
        grpc_port: where nginx listens for gRPC (HTTP/2 cleartext).
        host: listen address.
        workers: nginx worker processes (``auto``: one per core).
        max_body: ``client_max_body_size`` of an inference request.
        max_fails: failures that take a server out of rotation for ``fail_timeout``.
        fail_timeout: how long a failed server stays out before nginx tries it again.
        user: the ``user`` directive (only meaningful when nginx starts as root).
        template: the template file.
        limits: token buckets per tenant and model (``gateway.shaping``); None: no shaping.
        shaping_log: where nginx writes a JSON line per shaped request (relative paths are
            under nginx's prefix).
        openai: serve OpenAI's embeddings API (/v1/embeddings, /v1/models) too; None: not.
        js_module: nginx's njs module (``load_module``) where nginx runs; None: found here.
        js_dir: the folder holding the scripts (``SCRIPTS``), as nginx will see it.
        conns_per_client: requests at once from one client address (HTTP/2 streams count).
        conns: requests at once on each listener, from every client together.
        client_timeout: how long a client may send nothing (headers, body) or read nothing.
        operators: client addresses or CIDR blocks that may read model configs and statistics
            (perf_analyzer needs both); everyone else gets 403 / PERMISSION_DENIED.

    Returns:
        The config text.
    """
    fields = {
        "@USER@": f"user {user};" if user else "",
        "@JS_MODULE@": js_module or find_js_module(),
        "@JS_DIR@": js_dir,
        "@WORKERS@": str(workers),
        "@MAX_BODY@": max_body,
        "@HTTP_SERVERS@": _servers(http_upstreams, max_fails, fail_timeout),
        "@GRPC_SERVERS@": _servers(grpc_upstreams, max_fails, fail_timeout),
        "@HOST@": host,
        "@HTTP_PORT@": str(http_port),
        "@GRPC_PORT@": str(grpc_port),
        # Every server once at most: more tries would only come back to a failed one.
        "@TRIES@": str(max(len(http_upstreams), len(grpc_upstreams))),
        "@CONNS_PER_CLIENT@": str(conns_per_client),
        "@CONNS@": str(conns),
        "@CLIENT_TIMEOUT@": client_timeout,
        "@SERVED@": "|".join(SERVED),
        "@SERVED_LIST@": " ".join(SERVED),
        "@HTTP_INFER@": HTTP_INFER.format(models="|".join(SERVED)),
        "@OPERATOR_ONLY@": OPERATOR_ONLY,
        "@OVERLOADED@": OVERLOADED,
        "@UNAVAILABLE@": UNAVAILABLE,
        "@OPERATORS@": "\n".join(f"            allow {_operator(a)};" for a in operators),
        "@UNKNOWN_MODEL@": f"unknown model: this gateway serves {', '.join(SERVED)}",
    }
    fields.update(openai_fields(openai))
    if limits is None:
        fields.update(dict.fromkeys(SHAPING_FIELDS, ""))
    else:
        fields.update(shaping(limits, grpc_port, shaping_log, openai is not None))
    text = template.read_text()
    for name, value in fields.items():
        text = text.replace(name, value)
    return text


def _operator(address: str) -> str:
    """An address or CIDR block for ``allow``, checked (nothing else reaches the config)."""
    return str(ipaddress.ip_network(address, strict=False))


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


class Nginx(ManagedProcess):
    """nginx in front of tritonservers, run from a temp prefix; a context manager.

    Ports of 0 are replaced by free ones at start.
    """

    name = "nginx"

    def __init__(
        self,
        http_upstreams: Sequence[str],
        grpc_upstreams: Sequence[str],
        http_port: int = 0,
        grpc_port: int = 0,
        host: str = "127.0.0.1",
        workers: int | str = "auto",
        log_path: Path | None = None,
        limits: Limits | None = None,
        openai: OpenAI | None = None,
        conns_per_client: int = 64,
        client_timeout: str = "10s",
        operators: Sequence[str] = (),
    ):
        super().__init__(log_path)
        self.limits = limits
        self.openai = openai
        self.binary = find_nginx()
        self.http_upstreams = list(http_upstreams)
        self.grpc_upstreams = list(grpc_upstreams)
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.host = host
        self.workers = workers
        self.conns_per_client = conns_per_client
        self.client_timeout = client_timeout
        self.operators = list(operators)
        self.prefix: Path | None = None

    @property
    def http_url(self) -> str:
        """host:port of nginx's HTTP listener (what tritonclient.http expects)."""
        return self.address(self.http_port)

    @property
    def grpc_url(self) -> str:
        """host:port of nginx's gRPC listener."""
        return self.address(self.grpc_port)

    @property
    def ready_url(self) -> str:
        """The URL of nginx's own readiness location (not the upstreams')."""
        return f"http://{self.http_url}/nginx-ready"

    @property
    def shaping_log(self) -> Path:
        """The JSON lines of shaped requests (with ``limits``), inside the prefix."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / SHAPING_LOG

    @property
    def config_path(self) -> Path:
        """The rendered config (inside the prefix)."""
        if self.prefix is None:
            raise RuntimeError("nginx has not been prepared yet")
        return self.prefix / "nginx.conf"

    def prepare(self) -> None:
        """Pick free ports, make the prefix and write the rendered config there."""
        self.http_port = self.port_or_free(self.http_port)
        self.grpc_port = self.port_or_free(self.grpc_port)
        self.prefix = Path(tempfile.mkdtemp(prefix="nginx-"))
        (self.prefix / "tmp").mkdir()
        self.shaping_log.parent.mkdir()
        # Started as root, nginx runs its workers as `nobody`, who cannot enter the 0700 temp
        # prefix; keep them as the user we are.
        user = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() == 0 else None
        self.config_path.write_text(
            render(
                self.http_upstreams,
                self.grpc_upstreams,
                self.http_port,
                self.grpc_port,
                host=self.host,
                workers=self.workers,
                user=user,
                limits=self.limits,
                openai=self.openai,
                conns_per_client=self.conns_per_client,
                client_timeout=self.client_timeout,
                operators=self.operators,
            )
        )

    def command(self) -> list[str]:
        """``nginx -p PREFIX -c CONF -e stderr -g 'daemon off;'`` (in the foreground)."""
        return [
            self.binary,
            "-p",
            f"{self.prefix}/",
            "-c",
            str(self.config_path),
            # The error log before the config is read: the default may be an unwritable file.
            "-e",
            "stderr",
            "-g",
            "daemon off;",
        ]

    def stop(self, timeout: float = 10.0, stop_requests=None) -> int | None:
        """Stop nginx (SIGTERM is its fast shutdown); the prefix goes with it."""
        return super().stop(timeout, stop_requests)

    def cleanup(self) -> None:
        """Remove the prefix (config, temp files)."""
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gateway.nginx render``: print a config for the given servers."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.nginx",
        description="Render the nginx config that shards HTTP and gRPC over tritonservers.",
        epilog="example: python -m gateway.nginx render --http triton-0:8000 --http triton-1:8000 "
        "--grpc triton-0:8001 --grpc triton-1:8001 --host 0.0.0.0 > nginx.conf",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="print the config to stdout")
    r.add_argument("--http", action="append", required=True, help="a server's HTTP host:port")
    r.add_argument("--grpc", action="append", required=True, help="a server's gRPC host:port")
    r.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    r.add_argument("--http-port", type=int, default=8000)
    r.add_argument("--grpc-port", type=int, default=8001)
    r.add_argument("--workers", default="auto", help="worker processes (default: one per core)")
    r.add_argument(
        "--conns-per-client",
        type=int,
        default=64,
        help="requests at once from one client address (default 64; HTTP/2 streams count)",
    )
    r.add_argument("--max-body", default="64m", help="client_max_body_size (default 64m)")
    r.add_argument("--user", help="the user directive, for nginx started as root")
    r.add_argument(
        "--limits",
        type=Path,
        help=f"token buckets per tenant and model (e.g. {LIMITS.relative_to(REPO_ROOT)}); "
        "default: no shaping",
    )
    r.add_argument(
        "--check", action="store_true", help="also run `nginx -t` on it (needs nginx here)"
    )
    r.add_argument(
        "--openai",
        action="store_true",
        help="serve OpenAI's embeddings API too (/v1/embeddings, /v1/models)",
    )
    r.add_argument(
        "--js-module",
        help="path of nginx's njs module where nginx runs (default: found here, e.g. "
        f"{JS_MODULES[0]}; the nginx image has {JS_MODULES[1]})",
    )
    r.add_argument(
        "--js-dir",
        default=str(OPENAI_SCRIPT.parent),
        help=f"the folder where nginx finds {' and '.join(SCRIPTS)} (default: this checkout's)",
    )
    r.add_argument(
        "--operator",
        action="append",
        type=_operator,
        default=[],
        metavar="ADDRESS",
        help="a client address or CIDR block that may read model configs and statistics "
        "(perf_analyzer needs both; repeatable); default: nobody",
    )
    r.add_argument(
        "--shaping-log",
        default=SHAPING_LOG,
        help=f"where nginx writes a JSON line per shaped request (default {SHAPING_LOG})",
    )
    args = parser.parse_args(argv)
    text = render(
        args.http,
        args.grpc,
        args.http_port,
        args.grpc_port,
        host=args.host,
        workers=args.workers,
        max_body=args.max_body,
        user=args.user,
        limits=load_limits(args.limits) if args.limits else None,
        shaping_log=args.shaping_log,
        openai=OpenAI() if args.openai else None,
        js_module=args.js_module,
        js_dir=args.js_dir,
        conns_per_client=args.conns_per_client,
        operators=args.operator,
    )
    if args.check:
        try:
            check_config(text)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
