"""One gRPC stream's responses, read to the stream's end by a task of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine

import grpc

from tritonllm.shim.mux_channel import ChannelClosed
from tritonllm.shim.triton_errors import TritonUnavailable
from tritonllm.wire import multiplex

# how long the last rows of a multiplexed generation may come after its own request ended (they are sent first,
# but on another stream)
LATE_ROWS_S = 30.0


class Call:
    """The responses of one gRPC stream, read to the stream's end by a task of its own.

    grpc.aio cancels a call whose reader is cancelled (a caller that goes away), or that is collected unfinished
    (a reader that stops at the final response, before the server has closed the stream). Read by a task of its
    own, the call ends only when the server ends it. Iterating yields (result, error) pairs, and raises
    TritonUnavailable if the connection fails.
    """

    _END = object()

    def __init__(self, responses, run: Callable[[Coroutine], asyncio.Task], late_rows: bool = False) -> None:
        """`late_rows`: responses may also come from a multiplexed channel (`deliver`), after the stream ended."""
        self._responses = responses
        self._queue: asyncio.Queue = asyncio.Queue()
        self._late_rows = late_rows
        self._stream_ended = False
        self.channel_failed = False  # the multiplexed channel ended before this generation did
        self.reader = run(self._read())

    def deliver(self, item: multiplex.Row | ChannelClosed) -> None:
        self.channel_failed = self.channel_failed or isinstance(item, ChannelClosed)
        self._queue.put_nowait(item if isinstance(item, ChannelClosed) else (item, None))

    async def _read(self) -> None:
        try:
            async for item in self._responses:
                self._queue.put_nowait(item)
        except grpc.RpcError as e:
            self._queue.put_nowait(TritonUnavailable(f"Triton stream failed: {e.code().name}: {e.details()}"))
        finally:
            self._queue.put_nowait(self._END)

    def cancel(self) -> None:
        self._responses.cancel()

    def __aiter__(self) -> Call:
        return self

    async def __anext__(self) -> tuple:
        while True:
            if self._stream_ended:
                try:
                    item = await asyncio.wait_for(self._queue.get(), LATE_ROWS_S)
                except TimeoutError:
                    raise TritonUnavailable("the llm ended the request, but not all its responses came") from None
            else:
                item = await self._queue.get()
            if item is not self._END:
                break
            if not self._late_rows:
                self._queue.put_nowait(item)  # every later read ends too
                raise StopAsyncIteration
            self._stream_ended = True
        if isinstance(item, TritonUnavailable):
            raise item
        if isinstance(item, ChannelClosed):
            raise TritonUnavailable(f"Triton stream failed: {item}")
        return item
