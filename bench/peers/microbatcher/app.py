"""The FastAPI application: KServe v2 endpoints over a served model and its micro-batcher."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from bench.peers.microbatcher.batcher import MicroBatcher
from bench.peers.microbatcher.models import (
    EXTENSIONS,
    HEADER_LENGTH,
    JSON_TYPE,
    MODEL_NAME,
    MODEL_VERSION,
    SERVER_NAME,
    InferenceRequestError,
    ServedModel,
    UnknownModelError,
    served_model,
)
from bench.peers.microbatcher.protocol import DecodedRequest, decode_request, encode_response
from bench.peers.microbatcher.stats import ModelStats, Timing

log = logging.getLogger(__name__)


# The application --------------------------------------------------------------------------
class _Peer:
    """What the routes share: the served model (or none), the batcher and the statistics."""

    def __init__(
        self,
        model: ServedModel,
        model_path: Path | None,
        intra_op_threads: int,
        max_batch: int,
        max_wait_ms: float,
    ):
        self.model = model
        self.max_batch = max_batch
        self.stats = ModelStats(model.name)
        self.ready = False
        self.batcher: MicroBatcher | None = None
        self.description = f"{model.name}: null model (zeros)"
        if model_path is not None:
            run_batch = model.load(model_path, intra_op_threads)
            self.batcher = MicroBatcher(run_batch, max_batch, max_wait_ms, self.stats)
            self.description = (
                f"{model.name}: {model_path} ({intra_op_threads} intra-op threads, "
                f"max batch {max_batch}, max wait {max_wait_ms} ms)"
            )
        # Null mode answers slices of one preallocated array.
        self.zeros = model.null_result(max_batch)

    async def infer(self, request: DecodedRequest) -> tuple[np.ndarray, Timing]:
        if self.batcher is None:
            self.stats.record_execution(request.rows, 0, 0)
            return self.zeros[: request.rows], Timing()
        return await self.batcher.submit_timed(request.data)

    def config(self) -> dict:
        """The model configuration, shaped like Triton's JSON ``/config`` answer."""
        return self.model.config(self.max_batch, self.batcher.max_wait if self.batcher else 0)


def _json(content: object, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type=JSON_TYPE)


def _error(message: str, status: int = 400) -> Response:
    return _json({"error": message}, status)


def _check_model(request: Request, served: str) -> None:
    model = request.path_params["model"]
    version = request.path_params.get("version", MODEL_VERSION)
    if model != served:
        raise UnknownModelError(f"Request for unknown model: '{model}' is not found")
    if version not in (MODEL_VERSION, ""):
        raise UnknownModelError(f"Request for unknown model: '{model}' version {version}")


def create_app(
    model_path: Path | None,
    intra_op_threads: int = 1,
    max_batch: int | None = None,
    max_wait_ms: float = 2.0,
    model_name: str = MODEL_NAME,
) -> FastAPI:
    """The peer server as an ASGI app; the model session is opened (and warmed up) here.

    Args:
        model_path: the model's ONNX file (the encoder's for ``embed``); None serves the null
            model (zeros, no model).
        intra_op_threads: onnxruntime intra-op threads for the one session.
        max_batch: the most rows per model run, and per request (``max_batch_size``); default:
            the model's (32 for the classifier, 64 for embed, as in Triton).
        max_wait_ms: how long a batch waits for more requests after its first one.
        model_name: ``classifier`` or ``embed``: the model served, under that name.

    Returns:
        The FastAPI application; its lifespan starts and stops the micro-batcher.

    Raises:
        ValueError: ``model_name`` is not one the peer serves.
    """
    model = served_model(model_name)
    peer = _Peer(model, model_path, intra_op_threads, max_batch or model.max_batch, max_wait_ms)
    app = FastAPI(
        title=f"{model.name} peer (FastAPI + micro-batcher)",
        lifespan=_lifespan,
        exception_handlers=_ERROR_HANDLERS,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.peer = peer  # what every route and the lifespan read
    for path, endpoint, method in _ROUTES:
        app.add_api_route(path, endpoint, methods=[method], include_in_schema=False)
    return app


def _peer_of(request: Request) -> _Peer:
    return request.app.state.peer


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Ready while the micro-batcher runs: started with the server, closed when it stops."""
    peer: _Peer = app.state.peer
    if peer.batcher is not None:
        peer.batcher.start()
    peer.ready = True
    log.info("peer ready: %s", peer.description)
    try:
        yield
    finally:
        peer.ready = False
        if peer.batcher is not None:
            await peer.batcher.close()


# Errors are answered as KServe v2 does: {"error": "..."} ----------------------------------
async def _bad_request(request: Request, exc: InferenceRequestError) -> Response:
    _peer_of(request).stats.fail.add(0)
    return _error(str(exc), 400)


async def _unknown_model(_request: Request, exc: UnknownModelError) -> Response:
    return _error(str(exc), 404)


async def _http_error(_request: Request, exc: StarletteHTTPException) -> Response:
    return _error(str(exc.detail), exc.status_code)


async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
    return _error(str(exc), 400)


_ERROR_HANDLERS = {
    InferenceRequestError: _bad_request,
    UnknownModelError: _unknown_model,
    StarletteHTTPException: _http_error,
    RequestValidationError: _invalid,
}


# The KServe v2 routes ----------------------------------------------------------------------
async def _live(_request: Request) -> Response:
    return Response(status_code=200)


async def _ready(request: Request) -> Response:
    return Response(status_code=200 if _peer_of(request).ready else 503)


async def _server_metadata(_request: Request) -> Response:
    # perf_analyzer asks for server-side statistics only when "statistics" is listed.
    return _json({"name": SERVER_NAME, "version": "1", "extensions": list(EXTENSIONS)})


async def _model_ready(request: Request) -> Response:
    peer = _peer_of(request)
    _check_model(request, peer.model.name)
    return Response(status_code=200 if peer.ready else 503)


async def _model_metadata(request: Request) -> Response:
    peer = _peer_of(request)
    _check_model(request, peer.model.name)
    return _json(peer.model.metadata())


async def _model_config(request: Request) -> Response:
    peer = _peer_of(request)
    _check_model(request, peer.model.name)
    return _json(peer.config())


async def _model_stats(request: Request) -> Response:
    peer = _peer_of(request)
    if "model" in request.path_params:
        _check_model(request, peer.model.name)
    return _json({"model_stats": [peer.stats.as_json()]})


async def _infer(request: Request) -> Response:
    start = time.perf_counter_ns()
    peer = _peer_of(request)
    model = peer.model
    _check_model(request, model.name)
    decoded = decode_request(
        await request.body(),
        request.headers.get(HEADER_LENGTH),
        peer.max_batch,
        # The null model skips converting the inputs: it measures the load generator.
        convert=peer.batcher is not None,
        model=model,
    )
    try:
        outputs, timing = await peer.infer(decoded)
    except Exception as exc:  # noqa: BLE001 - the model failed on this request
        log.warning("inference failed: %s", exc)
        peer.stats.fail.add(time.perf_counter_ns() - start)
        return _error(f"{model.name} failed: {exc}", 500)
    computed = time.perf_counter_ns()
    response = encode_response(outputs, decoded, model)
    done = time.perf_counter_ns()
    peer.stats.record_request(len(outputs), timing, done - computed, done - start)
    return response


_ROUTES = (
    ("/v2/health/live", _live, "GET"),
    ("/v2/health/ready", _ready, "GET"),
    ("/v2", _server_metadata, "GET"),
    ("/v2/models/stats", _model_stats, "GET"),
    *(
        route
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")
        for route in (
            (base, _model_metadata, "GET"),
            (f"{base}/ready", _model_ready, "GET"),
            (f"{base}/config", _model_config, "GET"),
            (f"{base}/stats", _model_stats, "GET"),
            (f"{base}/infer", _infer, "POST"),
        )
    ),
)
