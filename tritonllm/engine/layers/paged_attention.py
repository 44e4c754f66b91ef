"""Attention over the engine's paged KV cache, plugged into any HF model through `AttentionInterface`.

The model is called on one packed (ragged) batch: `input_ids` of shape [1, total_tokens], positions restarting
per sequence. Each layer writes its new K/V into the cache slots of those tokens, then attends, per group of
sequences, over K/V gathered from the cache block by block. Decoding sequences form one padded group; each
prefill chunk is a group of its own, so a long prompt never pads the decodes.

The cache may hold another dtype than the model computes in (kv_cache_dtype): new keys and values are rounded
into it, and read back widened. The decode group, on CPU in float32, runs the native kernel (cpu_kernels.py),
which reads keys and values in place through the block tables. Otherwise the cache, laid out [num_blocks,
block_size, kv_heads, head_dim], is gathered whole block by block (four times faster than slot by slot here)
into scratch buffers that every layer of a step reuses rather than allocating (and page-faulting) megabytes per
layer, and goes to SDPA.

Each layer's own attention arguments apply on both paths: its scaling, its sliding window (Mistral, Qwen2, the
local layers of Gemma 2 and 3) and its score cap (Gemma 2). Rotary embeddings, per layer or not, are the model's.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tritonllm.engine.kernels import cpu_kernels

ATTN_IMPLEMENTATION = "tritonllm_paged"


@dataclass
class PaddedQueries:
    """What SDPA over gathered blocks needs beyond the block tables (groups that the native kernel does not run)."""

    query_index: torch.Tensor  # [B, max_q] positions in the packed batch (padding repeats a valid one)
    query_positions: torch.Tensor  # [B, 1, max_q, 1] each query's position in its sequence (padding: 0)
    causal: torch.Tensor  # [B, 1, max_q, max_blocks * block_size] True where a query may attend, window aside
    valid: torch.Tensor  # [B * max_q] which padded query rows are real
    # [B * max_blocks, block_size, kv_heads, head_dim] scratch shared by the layers
    key_buffer: torch.Tensor
    value_buffer: torch.Tensor
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)  # masks of the step's sliding windows

    def mask(self, window: int | None) -> torch.Tensor:
        """The causal mask, narrowed to the last `window` positions as transformers does (q - k < window)."""
        if window is None:
            return self.causal
        if window not in self.windowed:
            keys = torch.arange(self.causal.shape[-1], device=self.causal.device)
            self.windowed[window] = self.causal & (keys > self.query_positions - window)
        return self.windowed[window]


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
    # an int8 cache's scales, per layer: [num_blocks, block_size, num_kv_heads] float32, one per head vector (its
    # values stand for int8 x scale); empty tensors for any other dtype
    key_scale: list[torch.Tensor]
    value_scale: list[torch.Tensor]

    @classmethod
    def allocate(
        cls, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype, device
    ):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        layers = [_zeros(shape, dtype, device) for _ in range(2 * num_layers)]
        scaled = dtype == torch.int8
        scales = [
            _zeros(shape[:-1], torch.float32, device) if scaled else torch.empty(0, device=device)
            for _ in range(2 * num_layers)
        ]
        return cls(layers[:num_layers], layers[num_layers:], scales[:num_layers], scales[num_layers:])

    @staticmethod
    def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
        """The memory one block takes across the layers, keys and values: what `allocate` lays out per block
        (`itemsize` 1: int8 values and a float32 scale per head vector)."""
        per_vector = head_dim * itemsize + (4 if itemsize == 1 else 0)
        return 2 * num_layers * block_size * num_kv_heads * per_vector

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copies whole blocks, source to destination, in every layer."""
        source = torch.tensor([s for s, _ in pairs], device=self.key[0].device)
        destination = torch.tensor([d for _, d in pairs], device=self.key[0].device)
        for layer in (*self.key, *self.value, *self.key_scale, *self.value_scale):
            if layer.numel():
                layer[destination] = layer[source]


def quantize_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., head_dim] float -> int8 values and a float32 scale per vector (its largest magnitude / 127), each
    value over the scale rounded to nearest even: as the native decoder stack writes an int8 cache."""
    x = x.float()
    scale = x.abs().amax(-1) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = torch.where(scale[..., None] > 0, torch.round(x / safe[..., None]), 0).clamp(-127, 127)
    return values.to(torch.int8), scale


def dequantize_heads(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return values.float() * scale[..., None]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """Zeros. On CPU in an anonymous memory mapping, whose pages the OS hands out zeroed when first written: the
    pool, sized for the busiest hour, costs neither the time to clear it at load (0.45 s for SmolLM2's default
    1.5 GB) nor memory for blocks not yet used (freed blocks are reused oldest first, so a busy server's pool
    fills in as its prefix cache does)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, size), dtype=dtype).view(shape)  # the tensor keeps the mapping alive


@dataclass
class PagedBatch:
    """What every layer needs for one engine step; built once per step, passed to the model as a kwarg."""

    cache: KVCache
    slot_mapping: torch.Tensor  # [total_tokens] cache slot of each new token
    groups: list[AttentionGroup]
    probe: LayerProbe | None = None  # set at load, to see what each layer asks of attention


# Keyword arguments that transformers' models hand attention without changing what it computes.
INERT_ARGUMENTS = frozenset(
    {"position_ids", "use_cache", "output_attentions", "output_router_logits", "cache_position"}
)


@dataclass
class LayerProbe:
    """Records which layers attended through the cache and any argument this attention does not implement (e.g.
    gpt-oss's attention sinks), so that the model check refuses such a model at load instead of serving it
    inexactly."""

    layers: set[int] = field(default_factory=set)
    unsupported: dict[str, set[int]] = field(default_factory=dict)

    def record(self, layer: int, kwargs: dict) -> None:
        self.layers.add(layer)
        for name, value in kwargs.items():
            if name not in INERT_ARGUMENTS and value is not None and value is not False:
                self.unsupported.setdefault(name, set()).add(layer)


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged_batch: PagedBatch | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if paged_batch is None:
        raise RuntimeError(f"{ATTN_IMPLEMENTATION} attention needs the engine's paged_batch argument")
    layer = module.layer_idx
    if paged_batch.probe is not None:
        paged_batch.probe.record(layer, kwargs)
    cache = paged_batch.cache
    k_cache, v_cache = cache.key[layer], cache.value[layer]
    k_scale, v_scale = cache.key_scale[layer], cache.value_scale[layer]
    # query [1, Hq, T, D], key/value [1, Hkv, T, D] -> token-major [T, H, D]
    q = query[0].transpose(0, 1)
    for new, values, scales in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        new = new[0].transpose(0, 1)
        if values.dtype == torch.int8:
            new, scale = quantize_heads(new)
            scales.view(-1, scales.shape[-1]).index_copy_(0, paged_batch.slot_mapping, scale)
        values.view(-1, *values.shape[2:]).index_copy_(0, paged_batch.slot_mapping, new.to(values.dtype))

    out = torch.empty_like(q)
    num_heads, head_dim = q.shape[1], q.shape[2]
    scale = scaling if scaling is not None else head_dim**-0.5
    for g in paged_batch.groups:
        if g.padded is None:
            decoded = cpu_kernels.native().paged_decode_attention(
                q[g.out_index].contiguous(),
                k_cache,
                v_cache,
                g.block_index.view(len(g.context_lens), -1),
                g.context_lens,
                scale,
                sliding_window or 0,
                softcap or 0.0,
                k_scale,
                v_scale,
            )
            out[g.out_index] = decoded
            continue
        p = g.padded
        batch, context = p.causal.shape[0], p.causal.shape[-1]
        qg = q[p.query_index].transpose(1, 2)  # [B, Hq, max_q, D]
        torch.index_select(k_cache, 0, g.block_index, out=p.key_buffer)
        torch.index_select(v_cache, 0, g.block_index, out=p.value_buffer)
        keys, values = p.key_buffer, p.value_buffer
        if k_cache.dtype == torch.int8:
            keys = dequantize_heads(keys, k_scale[g.block_index])
            values = dequantize_heads(values, v_scale[g.block_index])
        # [B, Hkv, ctx, D], in the query's dtype (a bfloat16 or int8 cache's values widened)
        kg = keys.view(batch, context, *k_cache.shape[2:]).transpose(1, 2).to(q.dtype)
        vg = values.view(batch, context, *v_cache.shape[2:]).transpose(1, 2).to(q.dtype)
        og = _attend(qg, kg, vg, p.mask(sliding_window), scale, softcap)
        rows = og.transpose(1, 2).reshape(-1, num_heads, head_dim)
        out[g.out_index] = rows[p.valid]
    return out.unsqueeze(0), None


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap):
    """SDPA, or, for a model that caps its scores (softcap * tanh(score / softcap)), the same in plain ops."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    groups = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(groups, 1).transpose(-1, -2) * scale
    scores = (torch.tanh(scores / softcap) * softcap).masked_fill(~mask, float("-inf"))
    return scores.softmax(-1, dtype=torch.float32).to(q.dtype) @ v.repeat_interleave(groups, 1)


def register() -> None:
    """Names this attention to transformers, for a model loaded through it: imported here, transformers' model code
    would cost every llm process 130 MB, also those that run the model without it (llama_model.py)."""
    from transformers import AttentionInterface

    if ATTN_IMPLEMENTATION not in AttentionInterface():  # a test may have put its own in place
        AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
