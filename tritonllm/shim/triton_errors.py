"""How a Triton call fails, as the shim tells it apart: the models refused it (typed or not), or no answer came."""

from __future__ import annotations

from tritonllm.common import errors


class TritonRequestError(Exception):
    """Triton answered the request with an error: `typed` is the RequestError the models sent (common/errors.py),
    None for an error of another kind (a model's bug, or the server failed); `request_id`: the request's, where
    one was sent."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        self.typed = errors.from_message(message)
        self.request_id = request_id
        super().__init__(self.typed.message if self.typed else message)


class TritonUnavailable(Exception):
    """Triton could not be reached, or the connection broke: no answer came."""
