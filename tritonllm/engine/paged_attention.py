"""Attention over the engine's paged KV cache, plugged into any HF model through `AttentionInterface`.

The model is called on one packed (ragged) batch: `input_ids` of shape [1, total_tokens], positions restarting
per sequence. Each layer writes its new K/V into the cache slots of those tokens, then attends, per group of
sequences, over K/V gathered from the cache block by block. Decoding sequences form one padded group; each
prefill chunk is a group of its own, so a long prompt never pads the decodes.

The decode group, on CPU in float32, runs the native kernel (cpu_kernels.py), which reads keys and values in
place through the block tables. Otherwise the cache, laid out [num_blocks, block_size, kv_heads, head_dim], is
gathered whole block by block (four times faster than slot by slot here) into scratch buffers that every layer
of a step reuses rather than allocating (and page-faulting) megabytes per layer, and goes to SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from .cpu_kernels import decode_attention

ATTN_IMPLEMENTATION = "tritonllm_paged"


@dataclass
class PaddedQueries:
    """What SDPA over gathered blocks needs beyond the block tables (groups that the native kernel does not run)."""

    query_index: torch.Tensor  # [B, max_q] positions in the packed batch (padding repeats a valid one)
    mask: torch.Tensor  # [B, 1, max_q, max_blocks * block_size] True where a query may attend
    valid: torch.Tensor  # [B * max_q] which padded query rows are real
    # [B * max_blocks, block_size, kv_heads, head_dim] scratch shared by the layers
    key_buffer: torch.Tensor
    value_buffer: torch.Tensor


@dataclass
class AttentionGroup:
    block_index: torch.Tensor  # [B * max_blocks] each sequence's blocks, padded with block 0
    context_lens: torch.Tensor  # [B] tokens each sequence attends to
    out_index: torch.Tensor  # [num_real_queries] packed positions of the real rows, in order
    padded: PaddedQueries | None  # None: one query per sequence, run by the native decode kernel


@dataclass
class KVCache:
    key: list[torch.Tensor]  # per layer: [num_blocks, block_size, num_kv_heads, head_dim]
    value: list[torch.Tensor]

    @classmethod
    def allocate(
        cls, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype, device
    ):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
        )

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copies whole blocks, source to destination, in every layer."""
        source = torch.tensor([s for s, _ in pairs], device=self.key[0].device)
        destination = torch.tensor([d for _, d in pairs], device=self.key[0].device)
        for layer in (*self.key, *self.value):
            layer[destination] = layer[source]


@dataclass
class PagedBatch:
    """What every layer needs for one engine step; built once per step, passed to the model as a kwarg."""

    cache: KVCache
    slot_mapping: torch.Tensor  # [total_tokens] cache slot of each new token
    groups: list[AttentionGroup]


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged_batch: PagedBatch | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if paged_batch is None:
        raise RuntimeError(f"{ATTN_IMPLEMENTATION} attention needs the engine's paged_batch argument")
    layer = module.layer_idx
    k_cache = paged_batch.cache.key[layer]
    v_cache = paged_batch.cache.value[layer]
    # query [1, Hq, T, D], key/value [1, Hkv, T, D] -> token-major [T, H, D]
    q = query[0].transpose(0, 1)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, paged_batch.slot_mapping, key[0].transpose(0, 1))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, paged_batch.slot_mapping, value[0].transpose(0, 1))

    out = torch.empty_like(q)
    num_heads, head_dim = q.shape[1], q.shape[2]
    for g in paged_batch.groups:
        if g.padded is None:
            decoded = decode_attention(
                q[g.out_index].contiguous(),
                k_cache,
                v_cache,
                g.block_index.view(len(g.context_lens), -1),
                g.context_lens,
                scaling if scaling is not None else head_dim**-0.5,
            )
            out[g.out_index] = decoded
            continue
        p = g.padded
        batch, context = p.mask.shape[0], p.mask.shape[-1]
        qg = q[p.query_index].transpose(1, 2)  # [B, Hq, max_q, D]
        torch.index_select(k_cache, 0, g.block_index, out=p.key_buffer)
        torch.index_select(v_cache, 0, g.block_index, out=p.value_buffer)
        kg = p.key_buffer.view(batch, context, *k_cache.shape[2:]).transpose(1, 2)  # [B, Hkv, ctx, D]
        vg = p.value_buffer.view(batch, context, *v_cache.shape[2:]).transpose(1, 2)
        og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=p.mask, scale=scaling, enable_gqa=True)
        rows = og.transpose(1, 2).reshape(-1, num_heads, head_dim)
        out[g.out_index] = rows[p.valid]
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
