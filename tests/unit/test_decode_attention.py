"""The native decode-attention kernel against PyTorch's SDPA over the same context, gathered from the cache,
with and without a sliding window and a score cap."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tritonllm.engine.kernels import cpu_kernels

# Built (or loaded from the cache) here: a build that fails is this module's error, never a skip.
cpu_kernels.build()


def decode_attention(*args):
    """The kernel on a float32 or bfloat16 cache (no int8 scales)."""
    return cpu_kernels.native().paged_decode_attention(*args, torch.empty(0), torch.empty(0))


def gathered_reference(q, k_cache, v_cache, tables, lens, scale, window=0, softcap=0.0):
    """One sequence at a time: its context copied out of the cache, cut to the window, then plain SDPA (or, with
    a score cap, the same in plain ops, as transformers' eager attention)."""
    rows = []
    for b, length in enumerate(lens.tolist()):
        first = max(0, length - window) if window else 0
        k = k_cache[tables[b]].flatten(0, 1)[first:length].transpose(0, 1)  # [Hkv, seen, D]
        v = v_cache[tables[b]].flatten(0, 1)[first:length].transpose(0, 1)
        if softcap:
            groups = q.shape[1] // k.shape[0]
            scores = q[b][:, None] @ k.repeat_interleave(groups, 0).transpose(1, 2) * scale
            weights = (torch.tanh(scores / softcap) * softcap).softmax(-1)
            out = weights @ v.repeat_interleave(groups, 0)
        else:
            out = F.scaled_dot_product_attention(q[b][:, None], k, v, scale=scale, enable_gqa=True)
        rows.append(out[:, 0])
    return torch.stack(rows)


@pytest.mark.parametrize(
    "q_heads, kv_heads, head_dim, block_size, window, softcap",
    [
        (8, 8, 64, 16, 0, 0.0),  # MHA
        (8, 2, 64, 16, 0, 0.0),  # GQA
        (4, 4, 24, 4, 0, 0.0),  # sizes off the vector width
        (6, 3, 33, 5, 0, 0.0),
        (8, 2, 64, 16, 20, 0.0),  # a sliding window that starts mid-block
        (6, 3, 33, 5, 7, 0.0),
        (8, 4, 32, 16, 0, 5.0),  # Gemma 2's capped scores
        (8, 4, 32, 4, 9, 5.0),
    ],
)
def test_matches_sdpa_over_the_gathered_context(q_heads, kv_heads, head_dim, block_size, window, softcap):
    g = torch.Generator().manual_seed(q_heads * 1000 + head_dim)
    num_blocks, batch = 128, 7
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    q = torch.randn(batch, q_heads, head_dim, generator=g) * 3  # peaked softmaxes too
    lens = torch.tensor([1, block_size, block_size + 1, 37, 2, 3 * block_size, 50])
    max_blocks = -(-int(lens.max()) // block_size)
    tables = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].view(batch, max_blocks)
    scale = head_dim**-0.5

    out = decode_attention(q, k_cache, v_cache, tables, lens, scale, window, softcap)

    expected = gathered_reference(q, k_cache, v_cache, tables, lens, scale, window, softcap)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_threads_share_the_batch_without_changing_results():
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(2, 128, 16, 4, 32, generator=g)
    q = torch.randn(40, 4, 32, generator=g)
    lens = torch.randint(1, 16 * 8, (40,), generator=g)
    tables = torch.randint(0, 128, (40, 8), generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = decode_attention(q, k_cache, v_cache, tables, lens, 0.2, 0, 0.0)
        torch.set_num_threads(max(2, threads))
        shared = decode_attention(q, k_cache, v_cache, tables, lens, 0.2, 0, 0.0)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, shared)
