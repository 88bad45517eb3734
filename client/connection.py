"""Protocol-independent access to tritonclient: one place that knows HTTP from gRPC."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}
PROTOCOLS = tuple(DEFAULT_URLS)
# The header the gateway reads a tenant's key from (gateway.shaping.DEFAULT_HEADER). Lower case:
# gRPC metadata keys must be, and HTTP header names are compared without case.
API_KEY_HEADER = "x-api-key"
API_KEY_ENV = "TRITON_API_KEY"  # where the command line takes the key from


class ClientError(RuntimeError):
    """A failure worth a one-line message to the user (server down, model not ready, bad input)."""


def module(protocol: str, asyncio: bool = False) -> ModuleType:
    """The tritonclient module for a protocol: ``tritonclient.http[.aio]`` or ``.grpc[.aio]``."""
    if protocol == "http":
        if asyncio:
            import tritonclient.http.aio as mod
        else:
            import tritonclient.http as mod
    elif protocol == "grpc":
        if asyncio:
            import tritonclient.grpc.aio as mod
        else:
            import tritonclient.grpc as mod
    else:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    return mod


def default_url(protocol: str) -> str:
    """Localhost with Triton's default port for the protocol."""
    return DEFAULT_URLS[protocol]


def describe_unreachable(url: str, protocol: str, exc: BaseException) -> ClientError:
    """The error for a server that does not answer, with what to try."""
    return ClientError(
        f"cannot reach Triton at {url} over {protocol} ({type(exc).__name__}: {exc}); "
        "is the server running (make serve) and is the URL/port right?"
    )


def infer_error(model: str, exc: BaseException) -> ClientError:
    """The error for a failed inference, with Triton's own message."""
    message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    return ClientError(f"{model}: {message}")


@contextlib.contextmanager
def triton_errors(model: str) -> Iterator[None]:
    """Triton's refusal of a request to ``model``, raised as a ClientError with its message."""
    from tritonclient.utils import InferenceServerException

    try:
        yield
    except InferenceServerException as exc:
        raise infer_error(model, exc) from None


def is_http(mod: ModuleType) -> bool:
    """True for the tritonclient HTTP modules (which want binary_data flags)."""
    return mod.__name__.startswith("tritonclient.http")


def make_input(mod: ModuleType, name: str, array, datatype: str):
    """An InferInput holding ``array`` (binary tensor data over HTTP)."""
    tensor = mod.InferInput(name, list(array.shape), datatype)
    if is_http(mod):
        tensor.set_data_from_numpy(array, binary_data=True)
    else:
        tensor.set_data_from_numpy(array)
    return tensor


def make_outputs(mod: ModuleType, names):
    """Requested outputs; binary over HTTP so that floats skip JSON."""
    if is_http(mod):
        return [mod.InferRequestedOutput(n, binary_data=True) for n in names]
    return [mod.InferRequestedOutput(n) for n in names]


@dataclass(frozen=True)
class Access:
    """What a gateway in front of Triton may ask of a client; empty for Triton itself.

    Attributes:
        api_key: the tenant's key, sent as ``x-api-key`` with every request (HTTP header or
            gRPC metadata).
        ca_file: a PEM file of the CA that signed the gateway's certificate; given, the client
            speaks TLS (HTTPS, gRPC over TLS) and trusts that CA only.
    """

    api_key: str | None = None
    ca_file: Path | None = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """``--api-key`` (default ``$TRITON_API_KEY``) and ``--ca-file``."""
        parser.add_argument(
            "--api-key",
            # Read when the arguments are parsed, so that --help never prints the key.
            default=None,
            help=f"the tenant's key for a gateway, sent as {API_KEY_HEADER} "
            f"(default: ${API_KEY_ENV}; prefer it: a flag shows in the process list)",
        )
        parser.add_argument(
            "--ca-file",
            type=Path,
            help="PEM file of the CA that signed the gateway's certificate: speak TLS, trust it",
        )

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> Access:
        """The key (``--api-key``, else ``$TRITON_API_KEY``) and CA file parsed."""
        return cls(
            api_key=args.api_key or os.environ.get(API_KEY_ENV) or None, ca_file=args.ca_file
        )

    def client_options(self, mod: ModuleType) -> dict:
        """Keyword arguments of ``mod.InferenceServerClient`` for TLS (none without a CA)."""
        if self.ca_file is None:
            return {}
        ca = str(self.ca_file)
        if not Path(ca).is_file():
            raise ClientError(f"CA file {ca} does not exist")
        if mod.__name__ == "tritonclient.http":
            import gevent.ssl  # the sync HTTP client's sockets are gevent's

            factory = functools.partial(gevent.ssl.create_default_context, cafile=ca)
            return {"ssl": True, "ssl_context_factory": factory}
        if mod.__name__ == "tritonclient.http.aio":
            import ssl

            return {"ssl": True, "ssl_context": ssl.create_default_context(cafile=ca)}
        return {"ssl": True, "root_certificates": ca}  # gRPC reads the file itself

    def register(self, client) -> None:
        """Have ``client`` (any tritonclient client) send the key with every request."""
        if self.api_key:
            client.register_plugin(_ApiKey(self.api_key))


class _ApiKey:
    """A tritonclient plugin (``register_plugin``): called with each request before it is sent.

    Every call goes through it (health, metadata, inference), so none is sent without the key.
    """

    def __init__(self, key: str):
        self._key = key

    def __call__(self, request) -> None:
        request.headers[API_KEY_HEADER] = self._key


class _Connection:
    """What both clients hold: the tritonclient module and client for one model.

    ``model`` defaults to the subclass's ``default_model``. ``priority`` goes with every
    request: where the model (or an ensemble step) has priority levels, 1 is served first; 0
    means the model's default level. ``version`` is the model version every request asks for
    ("": the server's choice, the newest the model serves). ``access``: the tenant key and the
    TLS CA of a gateway in front of Triton.
    """

    default_model = ""
    asyncio = False  # tritonclient.http.aio / tritonclient.grpc.aio when True

    def __init__(
        self,
        url: str | None = None,
        protocol: str = "http",
        model: str | None = None,
        priority: int = 0,
        version: str = "",
        access: Access | None = None,
    ):
        self.protocol = protocol
        self.priority = priority
        self.version = version
        self.access = access or Access()
        self.url = url or default_url(protocol)
        self.model = model or self.default_model
        self.mod = module(protocol, asyncio=self.asyncio)
        self._client = self.mod.InferenceServerClient(
            self.url, **self.access.client_options(self.mod)
        )
        self.access.register(self._client)

    def _request(self, inputs, outputs) -> dict:
        """One inference's arguments: this connection's model, version and priority."""
        return {
            "model_name": self.model,
            "inputs": inputs,
            "model_version": self.version,
            "outputs": outputs,
            "priority": self.priority,
        }


class ModelClient(_Connection):
    """Synchronous client of one model (HTTP or gRPC); a context manager."""

    def check_ready(self) -> None:
        """Raise ClientError unless the server answers and the model is ready."""
        try:
            live = self._client.is_server_live()
        except Exception as exc:  # noqa: BLE001 - connection errors differ per protocol
            raise describe_unreachable(self.url, self.protocol, exc) from None
        if not live or not self._client.is_model_ready(self.model):
            raise ClientError(f"Triton at {self.url} is up but model '{self.model}' is not ready")

    def infer(self, inputs, outputs):
        """One inference; Triton's error becomes a ClientError with its message."""
        with triton_errors(self.model):
            return self._client.infer(**self._request(inputs, outputs))

    def close(self) -> None:
        """Close the connection."""
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncModelClient(_Connection):
    """asyncio client of one model (``tritonclient.http.aio`` / ``tritonclient.grpc.aio``)."""

    asyncio = True

    async def check_ready(self) -> None:
        """Raise ClientError unless the server answers and the model is ready."""
        try:
            live = await self._client.is_server_live()
        except Exception as exc:  # noqa: BLE001
            raise describe_unreachable(self.url, self.protocol, exc) from None
        if not live or not await self._client.is_model_ready(self.model):
            raise ClientError(f"Triton at {self.url} is up but model '{self.model}' is not ready")

    async def infer(self, inputs, outputs):
        """One inference; Triton's error becomes a ClientError with its message."""
        with triton_errors(self.model):
            return await self._client.infer(**self._request(inputs, outputs))

    async def close(self) -> None:
        """Close the connection."""
        await self._client.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
