"""Protocol-independent access to tritonclient: one place that knows HTTP from gRPC."""

from __future__ import annotations

from types import ModuleType

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}
PROTOCOLS = tuple(DEFAULT_URLS)


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
