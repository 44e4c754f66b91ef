"""Errors a request earns, typed from where they arise (engine, model repository) to the HTTP status the shim
answers with.

A Triton error response carries only a message (a decoupled gRPC stream has no status code per response, and
the ensemble passes its steps' messages on as they are), so the type travels at the head of the message:
`[invalid_argument:max_tokens] max_tokens is too large: ...`. Triton clients read it as text; the shim reads
it back with `from_message` and answers 400 or 429 with `param` set, never by guessing from the wording. An
overloaded error carries the seconds after which a retry may succeed too (`[overloaded:max_queue_size:3] ...`),
for the shim's `Retry-After`.

Only a RequestError is the client's fault. Any other exception inside a model is a bug: the model logs its
traceback and answers `internal_message`, which names the request and nothing of the exception, and the shim
answers 500 with the request id.
"""

from __future__ import annotations

import logging
import re


class RequestError(ValueError):
    """A request the server refuses as it is; `param` names the field (an input tensor, or an API field)."""

    code = "invalid_argument"
    status = 400

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message

    def wire(self) -> str:
        return f"[{self.code}:{self.param or ''}] {self.message}"


class Overloaded(RequestError):
    """Too many requests are waiting (or they would wait too long); the caller should retry after
    `retry_after_s` seconds."""

    code = "overloaded"
    status = 429

    def __init__(self, param: str | None, message: str, retry_after_s: int = 1) -> None:
        super().__init__(param, message)
        self.retry_after_s = max(1, retry_after_s)

    def wire(self) -> str:
        return f"[{self.code}:{self.param or ''}:{self.retry_after_s}] {self.message}"


_BY_CODE = {cls.code: cls for cls in (RequestError, Overloaded)}
_HEAD = re.compile(r"^\[(\w+):([\w.\[\]]*)(?::(\d+))?\] (.*)$", re.DOTALL)


INTERNAL = "internal"


def internal_message(request_id: str) -> str:
    """What a model answers for a bug of its own, in place of the exception's words."""
    return f"[{INTERNAL}:] internal error serving request {request_id or '(no id)'}; the server's log has its cause"


def to_message(error: Exception, request_id: str, log: logging.Logger) -> str:
    """What a model sends as its error response's message: a RequestError's typed wire form; anything else is
    logged with its traceback and answered as an internal error."""
    if isinstance(error, RequestError):
        return error.wire()
    log.error("internal error serving request %s", request_id or "(no id)", exc_info=error)
    return internal_message(request_id)


def from_message(message: str) -> RequestError | None:
    """The typed error at the head of a Triton error message (somewhere in it: Triton may prefix its own
    words, such as the ensemble step that failed), or None for an error of another kind."""
    for start in (m.start() for m in re.finditer(r"\[", message)):
        match = _HEAD.match(message[start:])
        if match and match.group(1) == Overloaded.code:
            return Overloaded(match.group(2) or None, match.group(4), int(match.group(3) or 1))
        if match and match.group(1) in _BY_CODE:
            return _BY_CODE[match.group(1)](match.group(2) or None, match.group(4))
    return None
