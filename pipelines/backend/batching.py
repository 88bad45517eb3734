"""One batching adapter for every Python-backend model: requests in, one run, responses out.

PyTriton's ``@batch`` idea, written for this repository's models. A model says how to read one
request (``parse``, which refuses a bad one with ``RequestError``) and how to run many at once
(``run``); ``execute`` does the rest for every ``execute(requests)`` Triton makes:

* a cancelled request gets a CANCELLED response and costs nothing;
* a bad request gets its own INVALID_ARG error (HTTP 400), the others of the batch still run;
* requests whose arrays agree in their non-batch dims (``group``) run together, once;
* if a run fails as a whole and ``isolate`` is set, each member runs alone, so only the
  culprit fails; ``run`` may also fail single members (an undecodable image) by returning an
  exception in their place;
* a failure that is not the request's fault (the run raised, returned the wrong number of
  results or of output rows, a response could not be built) is INTERNAL (HTTP 500) and names
  the model: a client should not change its input for it, an operator should look;
* one response per request, in request order.

Imported only inside Triton's Python-backend stub, where ``triton_python_backend_utils`` exists
(tests use the stand-in in tests/fake_triton/).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from pipelines.backend import step_traces
from pipelines.rows import RowCountError, split_rows


class RequestError(ValueError):
    """A request that cannot be served: its client gets this message, the batch goes on."""


def execute(
    requests: Sequence[pb_utils.InferenceRequest],
    parse: Callable[[pb_utils.InferenceRequest], Any],
    run: Callable[[list[Any]], list[dict | Exception]],
    *,
    model: str,
    group: Callable[[Any], Hashable] | None = None,
    respond: Callable[[dict], pb_utils.InferenceResponse] | None = None,
    isolate: bool = False,
    rows: Callable[[Any], int] | None = None,
) -> list[pb_utils.InferenceResponse]:
    """One response per request, in order, from one ``run`` per group of compatible requests.

    Args:
        requests: what Triton handed to ``execute``.
        parse: one request → what ``run`` takes for it; raises ``RequestError`` for a bad one.
        run: the parsed requests of one group → one outputs dict (or an exception) each.
        model: the model's name (``initialize``'s ``args["model_name"]``), for error messages.
        group: parsed request → key; requests with equal keys run together (default: all).
        respond: outputs dict → response (default ``respond_arrays``, numpy arrays).
        isolate: when a run raises, run each of its requests alone to fail only the culprit.
        rows: parsed request → the rows each of its outputs must have (default: unchecked
            here; ``concatenated`` checks the whole batch).
    """
    respond = respond or respond_arrays
    responses: list = [None] * len(requests)
    # Each traced request's span of this step: its phases (step_traces.phase) go under it.
    parents = step_traces.contexts(requests)
    parsed: dict[int, Any] = {}
    for i, request in enumerate(requests):
        if request.is_cancelled():
            responses[i] = cancelled()
            continue
        try:
            parsed[i] = parse(request)
        except Exception as exc:  # noqa: BLE001 - one request's failure, answered alone
            responses[i] = _failure(model, exc)
    groups: dict[Hashable, list[int]] = {}
    for i, item in parsed.items():
        groups.setdefault(group(item) if group else None, []).append(i)
    for members in groups.values():
        items = [parsed[i] for i in members]
        with step_traces.running([parents[i] for i in members]):
            try:
                results = _run(run, items)
            except Exception as exc:  # noqa: BLE001 - the whole group failed: isolate or report
                if not isolate or len(members) == 1:
                    results = [exc] * len(members)
                else:
                    results = [_alone(run, item) for item in items]
        for i, item, result in zip(members, items, results, strict=True):
            if rows is not None and isinstance(result, dict):
                result = _rows_checked(result, rows(item))
            if isinstance(result, Exception):
                responses[i] = _failure(model, result)
                continue
            try:
                responses[i] = respond(result)
            except Exception as exc:  # noqa: BLE001 - outputs we cannot hand over: our fault
                responses[i] = _failure(model, exc)
    return responses


def _run(run: Callable[[list[Any]], list], items: list[Any]) -> list:
    results = run(items)
    if len(results) != len(items):
        raise RowCountError(f"run returned {len(results)} results for {len(items)} requests")
    return results


def _alone(run: Callable[[list[Any]], list], item: Any):
    try:
        return _run(run, [item])[0]
    except Exception as exc:  # noqa: BLE001 - this request is the culprit
        return exc


def _rows_checked(outputs: dict, want: int) -> dict | RowCountError:
    for name, value in outputs.items():
        if len(value) != want:
            return RowCountError(f"output {name} has {len(value)} rows for {want} input rows")
    return outputs


def _failure(model: str, exc: Exception) -> pb_utils.InferenceResponse:
    """INVALID_ARG for the request's own fault (``RequestError``), INTERNAL for anything else."""
    if isinstance(exc, RequestError):
        return error(str(exc), pb_utils.TritonError.INVALID_ARG)
    return error(f"model {model} failed: {exc}", pb_utils.TritonError.INTERNAL)


def concatenated(
    fn: Callable[[dict[str, Any]], dict[str, Any]], concat: Callable = np.concatenate
) -> Callable[[list[dict]], list[dict]]:
    """``run`` for arrays: concatenate, call ``fn`` once, split back.

    Each input is concatenated along the batch axis, ``fn`` runs once on the batch, and every
    output is split back by the requests' batch sizes (numpy arrays or torch tensors). An output
    with more or fewer rows than the batch raises ``RowCountError``: its rows cannot be told
    apart per request.
    """

    def run(items: list[dict]) -> list[dict]:
        names = list(items[0])
        sizes = [len(item[names[0]]) for item in items]
        batch = {
            n: concat([item[n] for item in items]) if len(items) > 1 else items[0][n] for n in names
        }
        parts = {n: split_rows(v, sizes, n) for n, v in fn(batch).items()}
        return [{n: p[k] for n, p in parts.items()} for k in range(len(items))]

    return run


def shapes(item: dict) -> tuple:
    """``group`` key of a dict of arrays: their non-batch dims (e.g. equal sequence lengths)."""
    return tuple((name, tuple(value.shape[1:])) for name, value in item.items())


def inputs(
    request: pb_utils.InferenceRequest,
    names: Sequence[str],
    read: Callable | None = None,
) -> dict:
    """The named inputs of one request; ``RequestError`` for a missing or empty one.

    Args:
        request: the request.
        names: required inputs.
        read: ``read(request, name)`` → array or None (default ``input_array``).
    """
    read = read or input_array
    found = {}
    for name in names:
        value = read(request, name)
        if value is None:
            raise RequestError(f"input {name} is missing")
        if len(value) == 0:
            raise RequestError(f"{name} is empty")
        found[name] = value
    return found


def parameters(args: dict) -> dict[str, str]:
    """The model config's ``parameters`` as plain strings (from ``initialize``'s args)."""
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def max_batch_size(args: dict) -> int:
    """The model config's ``max_batch_size`` (from ``initialize``'s args)."""
    return int(json.loads(args["model_config"]).get("max_batch_size", 0))


def error(message: str, code) -> pb_utils.InferenceResponse:
    """A response that fails this request only, with a message naming the problem.

    Args:
        message: what the client reads.
        code: a ``pb_utils.TritonError`` code, always given: the stub's default is INTERNAL.
    """
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def cancelled() -> pb_utils.InferenceResponse:
    """The response for a request its client cancelled before we started on it."""
    return error("request cancelled", pb_utils.TritonError.CANCELLED)


def respond_arrays(outputs: dict[str, np.ndarray]) -> pb_utils.InferenceResponse:
    """A successful response holding the given named arrays."""
    tensors = [pb_utils.Tensor(k, np.ascontiguousarray(v)) for k, v in outputs.items()]
    return pb_utils.InferenceResponse(tensors)


def input_array(request: pb_utils.InferenceRequest, name: str) -> np.ndarray | None:
    """The named input as a numpy array (a view of Triton's buffer), or None if absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()
