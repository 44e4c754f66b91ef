"""A media part the server refuses, named by where it sits in the request (`messages[0].content[1].image_url`)."""

from __future__ import annotations

from tritonllm.common.errors import RequestError


class MediaError(RequestError):
    """Unreadable, too large, of a format the pages do not take, or from a place the server may not read."""
