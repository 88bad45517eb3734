"""The batching adapter (pipelines/backend/batching.py) with plain callables, no model.

Every ``run`` here is a small function that records what it was called with, so each test
checks how many runs happened and what each saw, not only what came back.
"""

from __future__ import annotations

import numpy as np
import pytest
import triton_python_backend_utils as pb_utils

from pipelines.backend import batching

MODEL = "toy"
INVALID, INTERNAL = pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.INTERNAL
CANCELLED = pb_utils.TritonError.CANCELLED


class Counting:
    """``fn`` for ``batching.concatenated``: ``Y = 10 * X``; records each call's batch shape."""

    def __init__(self, drop_rows: int = 0, poison: float | None = None):
        self.shapes: list[tuple] = []
        self.drop_rows, self.poison = drop_rows, poison

    def __call__(self, batch: dict) -> dict:
        x = batch["X"]
        self.shapes.append(x.shape)
        if self.poison is not None and np.any(x == self.poison):
            raise FloatingPointError("the network diverged")
        return {"Y": (10 * x)[: len(x) - self.drop_rows]}


def request(x, cancelled: bool = False) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(
        [pb_utils.Tensor("X", np.asarray(x, np.float32))], cancelled=cancelled
    )


def parse(r) -> dict:
    return batching.inputs(r, ["X"])


def serve(requests, fn, **kwargs) -> list:
    return batching.execute(requests, parse, batching.concatenated(fn), model=MODEL, **kwargs)


def y(response) -> np.ndarray:
    assert not response.has_error(), response.error().message()
    return pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()


def error(response) -> tuple[int, str]:
    assert response.has_error(), "the request succeeded"
    return response.error().code(), response.error().message()


def test_requests_of_equal_shapes_run_once_together_and_keep_their_order():
    fn = Counting()
    rows = [[[1, 1, 1]], [[2, 2, 2], [3, 3, 3]], [[4, 4, 4]]]
    responses = serve([request(r) for r in rows], fn)
    assert fn.shapes == [(4, 3)]  # one run, every row
    for response, r in zip(responses, rows, strict=True):
        np.testing.assert_array_equal(y(response), 10 * np.asarray(r))


def test_mixed_shapes_run_once_per_shape_and_answer_in_request_order():
    fn = Counting()
    # Interleaved: shape (3,), (5,), (3,), (5,), (3,).
    rows = [np.full((1, 3), 1), np.full((2, 5), 2), np.full((2, 3), 3), np.full((1, 5), 4)]
    rows.append(np.full((1, 3), 5))
    responses = serve([request(r) for r in rows], fn, group=batching.shapes)
    # One run per shape group, in the order each shape first came, with all of its rows.
    assert fn.shapes == [(4, 3), (3, 5)]
    assert len(responses) == len(rows)
    for response, r in zip(responses, rows, strict=True):
        np.testing.assert_array_equal(y(response), 10 * r)


def test_a_cancelled_request_gets_cancelled_and_costs_nothing():
    fn, parsed = Counting(), []

    def parse_counted(r):
        parsed.append(r)
        return parse(r)

    live, gone = request([[1, 2]]), request([[7, 7]], cancelled=True)
    responses = batching.execute(
        [live, gone, request([[3, 4]])], parse_counted, batching.concatenated(fn), model=MODEL
    )
    assert error(responses[1]) == (CANCELLED, "request cancelled")
    assert gone not in parsed
    assert fn.shapes == [(2, 2)]  # the cancelled row never reached the run
    np.testing.assert_array_equal(y(responses[0]), [[10, 20]])
    np.testing.assert_array_equal(y(responses[2]), [[30, 40]])


def test_a_bad_request_is_invalid_arg_and_the_others_run_once():
    fn = Counting()
    responses = serve([request([[1.0]]), request(np.zeros((0, 1))), request([[2.0]])], fn)
    assert error(responses[1]) == (INVALID, "X is empty")
    assert fn.shapes == [(2, 1)]
    np.testing.assert_array_equal(y(responses[2]), [[20.0]])


def test_a_failing_run_is_isolated_to_its_own_request():
    fn = Counting(poison=-1.0)
    rows = [[[1.0]], [[-1.0], [2.0]], [[3.0]]]
    responses = serve([request(r) for r in rows], fn, isolate=True)
    # The whole batch once, then each request alone.
    assert fn.shapes == [(4, 1), (1, 1), (2, 1), (1, 1)]
    code, message = error(responses[1])
    assert code == INTERNAL
    assert message == f"model {MODEL} failed: the network diverged"
    np.testing.assert_array_equal(y(responses[0]), [[10.0]])
    np.testing.assert_array_equal(y(responses[2]), [[30.0]])


def test_without_isolation_a_failing_run_fails_its_whole_group_internal():
    fn = Counting(poison=-1.0)
    responses = serve([request([[1.0]]), request([[-1.0]])], fn)
    assert fn.shapes == [(2, 1)]
    assert [error(r)[0] for r in responses] == [INTERNAL, INTERNAL]


def test_a_wrong_number_of_output_rows_fails_the_group_internal_naming_model_and_counts():
    fn = Counting(drop_rows=1)  # one row short, which np.split would hand out silently
    responses = serve([request([[1.0], [2.0]]), request([[3.0]])], fn)
    assert fn.shapes == [(3, 1)]
    for response in responses:
        assert error(response) == (
            INTERNAL,
            f"model {MODEL} failed: output Y has 2 rows for 3 input rows",
        )


def test_a_run_returning_the_wrong_number_of_results_fails_internal():
    def run(items):
        return [{"Y": item["X"]} for item in items][:1]

    responses = batching.execute([request([[1.0]]), request([[2.0]])], parse, run, model=MODEL)
    for response in responses:
        assert error(response) == (
            INTERNAL,
            f"model {MODEL} failed: run returned 1 results for 2 requests",
        )


def test_rows_checks_each_requests_outputs():
    def run(items):  # the second request's output loses a row
        return [{"Y": item["X"][: len(item["X"]) - k]} for k, item in enumerate(items)]

    responses = batching.execute(
        [request([[1.0]]), request([[2.0], [3.0]])],
        parse,
        run,
        model=MODEL,
        rows=lambda item: len(item["X"]),
    )
    np.testing.assert_array_equal(y(responses[0]), [[1.0]])
    assert error(responses[1]) == (
        INTERNAL,
        f"model {MODEL} failed: output Y has 1 rows for 2 input rows",
    )


def test_a_parse_that_breaks_or_a_response_that_cannot_be_built_is_internal():
    def parse_buggy(r):
        x = parse(r)
        if x["X"][0, 0] == 0:
            raise KeyError("lookup table")
        return x

    def respond(outputs):
        if outputs["Y"][0, 0] == 20:
            raise TypeError("cannot hand this dtype over")
        return batching.respond_arrays(outputs)

    fn = Counting()
    responses = batching.execute(
        [request([[0.0]]), request([[1.0]]), request([[2.0]])],
        parse_buggy,
        batching.concatenated(fn),
        model=MODEL,
        respond=respond,
    )
    assert error(responses[0]) == (INTERNAL, f"model {MODEL} failed: 'lookup table'")
    np.testing.assert_array_equal(y(responses[1]), [[10.0]])
    assert error(responses[2]) == (INTERNAL, f"model {MODEL} failed: cannot hand this dtype over")
    assert fn.shapes == [(2, 1)]


def test_a_request_error_returned_by_run_is_invalid_arg_for_that_request_only():
    def run(items):
        return [
            batching.RequestError("X[0]: not a photo") if item["X"][0, 0] < 0 else {"Y": item["X"]}
            for item in items
        ]

    responses = batching.execute([request([[-1.0]]), request([[1.0]])], parse, run, model=MODEL)
    assert error(responses[0]) == (INVALID, "X[0]: not a photo")
    np.testing.assert_array_equal(y(responses[1]), [[1.0]])


@pytest.mark.parametrize("sizes", [[2, 1], [1, 1, 1]])
def test_split_rows_refuses_a_batch_whose_rows_do_not_add_up(sizes):
    with pytest.raises(batching.RowCountError, match=r"output LOGITS has 4 rows for \d input rows"):
        batching.split_rows(np.zeros((4, 2)), sizes, "LOGITS")
