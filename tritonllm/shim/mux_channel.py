"""The shim's end of the llm's multiplexed channel (tritonllm/runtime/multiplex.py): one gRPC stream that carries
the responses of the shim's generations, a row each, handed here to each generation's reader."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from ..runtime import multiplex


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
