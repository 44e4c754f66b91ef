"""Errors a request earns, typed from where they arise (engine, model repository) to the HTTP status the shim
answers with.

A Triton error response carries only a message (a decoupled gRPC stream has no status code per response, and
the ensemble passes its steps' messages on as they are), so the type travels at the head of the message:
`[invalid_argument:max_tokens] max_tokens is too large: ...`. Triton clients read it as text; the shim reads
it back with `from_message` and answers 400 or 429 with `param` set, never by guessing from the wording.
"""

from __future__ import annotations

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
    """Too many requests are waiting; the caller should retry later."""

    code = "overloaded"
    status = 429


_BY_CODE = {cls.code: cls for cls in (RequestError, Overloaded)}
_HEAD = re.compile(r"^\[(\w+):([\w.\[\]]*)\] (.*)$", re.DOTALL)


def to_message(error: Exception) -> str:
    """What a model sends as its error response's message."""
    return error.wire() if isinstance(error, RequestError) else str(error)


def from_message(message: str) -> RequestError | None:
    """The typed error at the head of a Triton error message (somewhere in it: Triton may prefix its own
    words, such as the ensemble step that failed), or None for an error of another kind."""
    for start in (m.start() for m in re.finditer(r"\[", message)):
        match = _HEAD.match(message[start:])
        if match and match.group(1) in _BY_CODE:
            return _BY_CODE[match.group(1)](match.group(2) or None, match.group(3))
    return None
