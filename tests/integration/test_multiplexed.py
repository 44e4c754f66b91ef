"""The llm's multiplexed channel (tritonllm/wire/multiplex.py) as the shim's client uses it: many generations'
responses as rows of one stream, the same answers as each generation's own stream gives."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from triton_helpers import metric, wait_for

from tritonllm.shim import mux_channel
from tritonllm.shim.triton_client import TritonLLMClient
from tritonllm.shim.triton_requests import GenerationRequest

STREAMS = 8


def _request(i: int, **extra) -> GenerationRequest:
    return GenerationRequest(
        max_tokens=10 + 3 * i, text=f"Stream {i} 你好 🙂", temperature=1.0, seed=i, num_samples=1 + i % 2, **extra
    )


async def _answer(client: TritonLLMClient, request: GenerationRequest) -> dict[int, tuple]:
    """Each sample's joined text, finish reason and token count."""
    texts: dict[int, str] = {}
    ends: dict[int, tuple] = {}
    async for chunk in client.generate(request):
        texts[chunk.index] = texts.get(chunk.index, "") + chunk.text
        if chunk.finish_reason:
            ends[chunk.index] = (chunk.finish_reason, chunk.num_output_tokens)
    return {i: (texts[i], *ends[i]) for i in sorted(texts)}


async def _answers(client: TritonLLMClient, **extra) -> list[dict[int, tuple]]:
    return await asyncio.wait_for(
        asyncio.gather(*(_answer(client, _request(i, **extra)) for i in range(STREAMS))), timeout=120
    )


@pytest.mark.asyncio
async def test_concurrent_generations_on_the_channel_equal_their_own_streams(triton, pytestconfig):
    # with several llm instances, the generations Triton hands to another than the channel's come on their own
    one_instance = pytestconfig.getoption("--llm-instances") == 1
    muxed, alone = TritonLLMClient(triton.grpc_url), TritonLLMClient(triton.grpc_url, direct=False)
    try:
        through_channel = await _answers(muxed)
        channel = muxed._mux
        assert channel is not None and not channel.closed
        # every sample's every response came as a row, and rows of several generations shared a response
        if one_instance:
            assert channel.rows >= sum(len(a) for a in through_channel)
            assert channel.rows > channel.responses
        through_ensemble = await _answers(alone)
        rows_before = channel.rows
        with_log_probs = await _answers(muxed, logprobs=True)  # not rows: answered on their own streams
        assert channel.rows == rows_before
    finally:
        await muxed.close()
        await alone.close()
    assert through_channel == through_ensemble
    assert with_log_probs == through_ensemble
    assert channel.closed  # close() closed it with a stop request, as the llm's FINAL response
    assert wait_for(lambda: metric(triton, "tritonllm_kv_blocks_used") == 0, timeout=30)


@pytest.mark.asyncio
async def test_a_worn_channel_gives_way_to_a_fresh_one_and_closes_once_its_generations_end(triton, monkeypatch):
    # tritonserver 2.51 keeps every response of a stream until it ends: a channel must not live as long as the server
    monkeypatch.setattr(mux_channel, "ROTATE_AFTER_RESPONSES", 5)
    muxed, alone = TritonLLMClient(triton.grpc_url), TritonLLMClient(triton.grpc_url, direct=False)
    long_request = dataclasses.replace(_request(0), max_tokens=600)
    try:
        spanning = asyncio.create_task(_answer(muxed, long_request))
        assert await asyncio.to_thread(wait_for, lambda: muxed._mux is not None and muxed._mux.worn, 60)
        first = muxed._mux
        later = asyncio.gather(*(_answer(muxed, _request(i)) for i in range(1, STREAMS)))
        # sent on fresh channels; the first stays open while the long one, sent on it, still runs
        assert await asyncio.to_thread(wait_for, lambda: muxed._mux is not first, 60)
        assert spanning.done() or not first.closed
        through_channels = [await spanning, *await asyncio.wait_for(later, 120)]
        await asyncio.wait_for(first.closing(), 30)  # closed by a stop once its last generation ended
        reference = [
            await _answer(alone, long_request),
            *[await _answer(alone, _request(i)) for i in range(1, STREAMS)],
        ]
    finally:
        await muxed.close()
        await alone.close()
    assert first.closed and first.responses >= 5
    assert through_channels == reference
    assert wait_for(lambda: metric(triton, "tritonllm_kv_blocks_used") == 0, timeout=30)
