"""Load: many concurrent streams through the ensemble, a quarter abandoned midway; nothing may leak.

Slow, so `make test` skips it; `make test-slow` runs it.
"""

from __future__ import annotations

import asyncio

import pytest
from triton_helpers import metric, wait_for

from tritonllm.shim.triton_client import TritonLLMClient
from tritonllm.shim.triton_requests import GenerationRequest

pytestmark = pytest.mark.slow

STREAMS = 128
ROUNDS = 3


async def one_stream(client: TritonLLMClient, i: int) -> tuple[bool, int]:
    """Returns (abandoned, tokens seen); every fourth stream is abandoned after a few chunks."""
    abandon = i % 4 == 0
    request = GenerationRequest(max_tokens=16 + i % 48, text=f"Load test {i} 你好", temperature=1.0, seed=i)
    seen = 0
    async for chunk in client.generate(request):
        seen = chunk.num_output_tokens
        if abandon and seen >= 3:
            return True, seen
        if chunk.finish_reason:
            assert chunk.finish_reason in ("end_id", "length")
            assert chunk.finish_reason == "end_id" or seen == request.max_tokens
    return False, seen


@pytest.mark.asyncio
async def test_concurrent_streams_with_abandoned_ones_leak_nothing(triton):
    client = TritonLLMClient(triton.grpc_url)
    cancelled_before = metric(triton, "tritonllm_requests_finished_total", 'reason="cancelled"')
    abandoned = 0
    try:
        for _ in range(ROUNDS):
            outcomes = await asyncio.wait_for(
                asyncio.gather(*(one_stream(client, i) for i in range(STREAMS))), timeout=300
            )
            abandoned += sum(a for a, _ in outcomes)
        await asyncio.sleep(0.5)  # the stop requests go out in the background
    finally:
        await client.close()
    # A stream abandoned just as it finished counts as finished, not cancelled.
    assert wait_for(lambda: metric(triton, "tritonllm_kv_blocks_used") == 0, timeout=30)
    assert metric(triton, "tritonllm_requests_running") == 0
    assert metric(triton, "tritonllm_requests_waiting") == 0
    cancelled = metric(triton, "tritonllm_requests_finished_total", 'reason="cancelled"') - cancelled_before
    assert 0 < cancelled <= abandoned
