"""Typed request errors travel through Triton's error messages and come out as the shim's HTTP status and param."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tritonllm.common import errors
from tritonllm.engine.state import inference_request
from tritonllm.shim.errors import APIError
from tritonllm.shim.triton_errors import TritonRequestError


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.RequestError("max_tokens", "max_tokens is too large: 9"), 400),
        (errors.Overloaded("max_queue_size", "overloaded: 3 queued"), 429),
        (errors.Overloaded("max_queue_wait", "overloaded: [2] ahead", retry_after_s=7), 429),
    ],
)
def test_a_typed_error_survives_the_trip_as_its_status_and_field(error, status):
    # the ensemble passes a step's message on, and Triton may put words of its own in front
    message = f"in ensemble 'ensemble', {errors.to_message(error, 'r1', logging.getLogger('test'))}"
    refused = APIError.refused(TritonRequestError(message))
    assert (refused.status, refused.param, refused.message) == (status, error.param, error.message)
    retry = getattr(error, "retry_after_s", None)
    assert refused.headers() == ({"Retry-After": str(retry)} if retry else None)


def test_an_untyped_error_is_an_internal_error_naming_the_request():
    refused = APIError.refused(TritonRequestError("Failed to process the request(s) for model 'llm'", "r7"))
    assert (refused.status, refused.param) == (500, None)
    assert "request r7" in refused.message and "Failed to process" not in refused.message


def test_a_bug_inside_a_model_is_logged_and_answered_without_its_words(caplog):
    bug = ValueError("invalid literal for int() with base 10: 'x'")
    message = errors.to_message(bug, "r9", logging.getLogger("tritonllm.llm"))
    assert errors.from_message(message) is None and "r9" in message and "invalid literal" not in message
    assert "r9" in caplog.text and "invalid literal" in caplog.text  # the traceback goes to the log


def test_the_engine_names_the_tensor_it_refuses():
    def get(name):
        return {"input_ids": np.array([[1, 2]], dtype=np.int32)}.get(name)

    with pytest.raises(errors.RequestError) as info:
        inference_request.parse(get, 100)
    wire = info.value.wire()
    assert info.value.param == "request_output_len"
    assert wire == "[invalid_argument:request_output_len] request_output_len is required"
