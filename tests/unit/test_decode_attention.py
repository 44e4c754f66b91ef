"""The native decode-attention kernel against PyTorch's SDPA over the same context, gathered from the cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tritonllm.engine.cpu_kernels import decode_attention

pytestmark = pytest.mark.skipif(decode_attention is None, reason="the native kernel could not be built here")


def gathered_sdpa(q, k_cache, v_cache, tables, lens, scale):
    """One sequence at a time: its context copied out of the cache, then plain SDPA."""
    rows = []
    for b, length in enumerate(lens.tolist()):
        k = k_cache[tables[b]].flatten(0, 1)[:length].transpose(0, 1)  # [Hkv, len, D]
        v = v_cache[tables[b]].flatten(0, 1)[:length].transpose(0, 1)
        out = F.scaled_dot_product_attention(q[b][:, None], k, v, scale=scale, enable_gqa=True)
        rows.append(out[:, 0])
    return torch.stack(rows)


@pytest.mark.parametrize(
    "q_heads, kv_heads, head_dim, block_size",
    [(8, 8, 64, 16), (8, 2, 64, 16), (4, 4, 24, 4), (6, 3, 33, 5)],  # MHA, GQA, and sizes off the vector width
)
def test_matches_sdpa_over_the_gathered_context(q_heads, kv_heads, head_dim, block_size):
    g = torch.Generator().manual_seed(q_heads * 1000 + head_dim)
    num_blocks, batch = 128, 7
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    q = torch.randn(batch, q_heads, head_dim, generator=g) * 3  # peaked softmaxes too
    lens = torch.tensor([1, block_size, block_size + 1, 37, 2, 3 * block_size, 50])
    max_blocks = -(-int(lens.max()) // block_size)
    tables = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].view(batch, max_blocks)
    scale = head_dim**-0.5

    out = decode_attention(q, k_cache, v_cache, tables, lens, scale)

    torch.testing.assert_close(out, gathered_sdpa(q, k_cache, v_cache, tables, lens, scale), rtol=1e-5, atol=1e-5)


def test_threads_share_the_batch_without_changing_results():
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(2, 128, 16, 4, 32, generator=g)
    q = torch.randn(40, 4, 32, generator=g)
    lens = torch.randint(1, 16 * 8, (40,), generator=g)
    tables = torch.randint(0, 128, (40, 8), generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = decode_attention(q, k_cache, v_cache, tables, lens, 0.2)
        torch.set_num_threads(max(2, threads))
        shared = decode_attention(q, k_cache, v_cache, tables, lens, 0.2)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, shared)
