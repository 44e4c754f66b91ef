"""The shim's end of the llm's multiplexed channel (tritonllm/wire/multiplex.py): one gRPC stream that carries
the responses of the shim's generations, a row each, handed here to each generation's reader.

A channel is worn after ROTATE_AFTER_RESPONSES responses: tritonserver 2.51's gRPC frontend keeps every response
of a streaming request, written or not, until the request ends (its ResponseQueue only grows; reused slots came in
triton-inference-server/server #7879, in 2.56), so a channel that lived as long as the server grew tritonserver's
memory by every token it carried. The shim sends new generations on a fresh channel and closes the worn one once
the generations sent on it have ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from tritonllm.wire import multiplex

# Each response tritonserver keeps costs it about a kilobyte (a protobuf of the rows' outputs), so a thousand bound a
# channel to about a megabyte, at the cost of one request to open it and one to close it.
ROTATE_AFTER_RESPONSES = 1000


class ChannelClosed(Exception):
    """The channel ended while a generation still waited for rows on it."""


class MuxChannel:
    def __init__(
        self,
        channel_id: str,
        responses: AsyncIterator[tuple[Any, Any]],
        outputs: Callable[[Any], dict[str, np.ndarray]],
    ) -> None:
        """`responses`: the opening request's (result, error) pairs; `outputs`: a result's arrays by name."""
        self.id = channel_id
        self.closed = False
        self.refusal: str | None = None  # the llm's error when it would not open the channel
        self.responses = 0  # responses read, and the rows they carried
        self.rows = 0
        self._responses = responses
        self._outputs = outputs
        self._listeners: dict[str, Callable[[object], None]] = {}
        self._reader: asyncio.Task | None = None
        self._holders = 0  # generations sent on the channel whose own stream has not ended
        self._unheld = asyncio.Event()
        self._unheld.set()

    async def open(self) -> bool:
        """Waits for the llm's first, empty answer: whether the channel is open (`refusal` says why not, where the
        llm answered with an error rather than the connection failing)."""
        try:
            _, error = await anext(self._responses)
        except Exception:  # the connection failed (or the stream ended at once)
            self.closed = True
            return False
        if error is not None:
            self.closed, self.refusal = True, error.message()
            return False
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return True

    def listen(self, request_id: str, deliver: Callable[[object], None]) -> None:
        """`deliver` gets each row of the generation `request_id`, then ChannelClosed if the channel ends first."""
        self._listeners[request_id] = deliver

    def forget(self, request_id: str) -> None:
        self._listeners.pop(request_id, None)

    def hold(self, own_stream: asyncio.Future) -> None:
        """A generation sent on the channel holds it open until `own_stream` (its own request's stream) is done:
        the llm sends a generation's last rows before the FINAL response of its own request."""
        self._holders += 1
        self._unheld.clear()
        own_stream.add_done_callback(self._release)

    def _release(self, _: asyncio.Future) -> None:
        self._holders -= 1
        if not self._holders:
            self._unheld.set()

    @property
    def worn(self) -> bool:
        """Whether new generations should go to a fresh channel (see the module's docstring)."""
        return self.responses >= ROTATE_AFTER_RESPONSES

    async def unheld(self) -> None:
        """Waits until no generation sent on the channel can get rows on it any more."""
        await self._unheld.wait()

    async def closing(self) -> None:
        """Waits until the channel's stream has ended (after a stop request for its id)."""
        if self._reader is not None:
            await self._reader

    async def _read(self) -> None:
        why = "the llm closed the multiplexed channel"
        try:
            async for result, error in self._responses:
                if error is not None:
                    why = error.message()
                    break
                outputs = self._outputs(result)
                if not outputs:  # the FINAL response that closes the channel
                    continue
                rows = multiplex.unpack(outputs)
                self.responses, self.rows = self.responses + 1, self.rows + len(rows)
                for row in rows:
                    deliver = self._listeners.get(row.request_id)
                    if deliver is not None:
                        deliver(row)
        except Exception as e:  # the connection failed
            why = str(e)
        finally:
            self.closed = True
            for deliver in list(self._listeners.values()):
                deliver(ChannelClosed(why))
