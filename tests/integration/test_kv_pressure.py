"""A KV pool far too small for the load, on the real tritonserver: 32 streams that together need about four
times the pool's 1,024 tokens all run to their end through preemption, each greedy answer equal to transformers'
generate(), and every block is free again afterwards."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import launch_triton
from oracles import greedy_text
from triton_helpers import Stream, metric, wait_for

from .test_triton import PROMPTS, ensemble_inputs, text_of

STREAMS, NEW_TOKENS, BLOCKS, BLOCK_SIZE = 32, 120, 64, 16


@pytest.fixture
def small_pool(tiny_model_dir, tmp_path):
    server = launch_triton(tiny_model_dir, tmp_path, settings={"num_kv_blocks": BLOCKS, "block_size": BLOCK_SIZE})
    yield server
    server.stop()


def test_streams_survive_a_pool_too_small_for_them(small_pool, tokenizer, hf_model):
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(STREAMS)]
    expected = [greedy_text(hf_model, tokenizer, tokenizer.encode(p), NEW_TOKENS)[0] for p in prompts]
    demand = sum(len(tokenizer.encode(p)) + NEW_TOKENS for p in prompts)
    assert demand > 3 * BLOCKS * BLOCK_SIZE  # the pool holds under a third of what the streams need at once

    def one(i: int) -> str:
        stream = Stream(small_pool.grpc_url)
        try:
            stream.send("ensemble", ensemble_inputs(prompts[i], NEW_TOKENS), request_id=f"pressed-{i}")
            return text_of(stream.until_final(timeout=300))
        finally:
            stream.close()

    with ThreadPoolExecutor(STREAMS) as pool:
        assert list(pool.map(one, range(STREAMS))) == expected
    assert metric(small_pool, "tritonllm_preemptions_total") > 0  # the pressure was real
    assert wait_for(lambda: metric(small_pool, "tritonllm_kv_blocks_used") == 0, timeout=30)
    assert metric(small_pool, "tritonllm_kv_blocks_free") == BLOCKS
    assert metric(small_pool, "tritonllm_requests_running") == 0
