"""Attention over the engine's paged KV cache, plugged into any HF model through `AttentionInterface`.

The model is called on one packed (ragged) batch: `input_ids` of shape [1, total_tokens], positions restarting
per sequence. Each layer writes its new K/V into the cache slots of those tokens, then attends, per group of
sequences, over K/V gathered from the cache by slot index. Decoding sequences form one padded group; each
prefill chunk is a group of its own, so a long prompt never pads the decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTN_IMPLEMENTATION = "tritonllm_paged"


@dataclass
class AttentionGroup:
    query_index: torch.Tensor  # [B, max_q] positions in the packed batch (padding repeats a valid one)
    kv_slots: torch.Tensor  # [B, max_kv] cache slots of each sequence's context (padding: slot 0)
    mask: torch.Tensor  # [B, 1, max_q, max_kv] True where a query may attend
    valid: torch.Tensor  # [B * max_q] which padded query rows are real
    out_index: torch.Tensor  # [num_real_queries] packed positions of the real rows, in order


@dataclass
class KVCache:
    key: list[torch.Tensor]  # per layer: [num_slots, num_kv_heads, head_dim]
    value: list[torch.Tensor]

    @classmethod
    def allocate(cls, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int, dtype, device):
        shape = (num_slots, num_kv_heads, head_dim)
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
        )


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
    k_cache.index_copy_(0, paged_batch.slot_mapping, key[0].transpose(0, 1))
    v_cache.index_copy_(0, paged_batch.slot_mapping, value[0].transpose(0, 1))

    out = torch.empty_like(q)
    num_heads, head_dim = q.shape[1], q.shape[2]
    for g in paged_batch.groups:
        qg = q[g.query_index].transpose(1, 2)  # [B, Hq, max_q, D]
        kg = k_cache[g.kv_slots].transpose(1, 2)  # [B, Hkv, max_kv, D]
        vg = v_cache[g.kv_slots].transpose(1, 2)
        og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=scaling, enable_gqa=True)
        rows = og.transpose(1, 2).reshape(-1, num_heads, head_dim)
        out[g.out_index] = rows[g.valid]
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
