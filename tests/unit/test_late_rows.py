"""A multiplexed generation's Call (shim/triton_call.py): its rows may come after its own stream ended."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tritonllm.shim import triton_call
from tritonllm.shim.mux_channel import ChannelClosed
from tritonllm.shim.triton_call import Call
from tritonllm.shim.triton_errors import TritonUnavailable
from tritonllm.wire import multiplex


async def _ended_stream():
    """A generation's own stream that ends at once (its FINAL response carries nothing the reader keeps)."""
    return
    yield


def _row(final: bool) -> multiplex.Row:
    return multiplex.Row("r", {"output_ids": np.zeros((1, 1, 0), dtype=np.int32)}, final)


def _call(late_rows: bool) -> Call:
    return Call(_ended_stream(), lambda coroutine: asyncio.get_running_loop().create_task(coroutine), late_rows)


@pytest.mark.asyncio
async def test_rows_after_the_stream_ended_are_still_read():
    call = _call(late_rows=True)
    await call.reader  # the own stream has ended
    row = _row(final=True)
    asyncio.get_running_loop().call_later(0.05, call.deliver, row)
    result, error = await anext(call)
    assert result is row and error is None


@pytest.mark.asyncio
async def test_a_stream_that_ends_without_rows_ends_the_iteration_unless_rows_may_follow():
    call = _call(late_rows=False)
    await call.reader
    with pytest.raises(StopAsyncIteration):
        await anext(call)


@pytest.mark.asyncio
async def test_rows_that_never_come_end_in_an_error(monkeypatch):
    monkeypatch.setattr(triton_call, "LATE_ROWS_S", 0.1)
    call = _call(late_rows=True)
    with pytest.raises(TritonUnavailable, match="not all its responses came"):
        await anext(call)


@pytest.mark.asyncio
async def test_a_closed_channel_fails_the_generation():
    call = _call(late_rows=True)
    call.deliver(ChannelClosed("the llm closed the multiplexed channel"))
    with pytest.raises(TritonUnavailable, match="closed the multiplexed channel"):
        await anext(call)
