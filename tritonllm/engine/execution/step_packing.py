"""A step's chunks packed into one forward pass's tensors: the fed tokens side by side with their positions and
cache slots, the rows that sample or record the prompt's logits, and how each token attends (attention groups for
transformers' modules, or block tables and context lengths for the native decoder stack)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonllm.engine.layers.paged_attention import AttentionGroup, PaddedQueries
from tritonllm.engine.scheduling.block_manager import BlockManager
from tritonllm.engine.scheduling.scheduler import ScheduledChunk


@dataclass
class Step:
    """One forward pass's tensors, as every rank of a tensor-parallel engine runs it."""

    inputs: dict[str, torch.Tensor]  # input_ids, or inputs_embeds
    position_ids: torch.Tensor
    slot_mapping: torch.Tensor
    groups: list[AttentionGroup]
    logits_to_keep: torch.Tensor
    copies: list  # KV blocks to copy first (copy on write)
    # for the native decoder stack, in place of groups: each fed token's block table and context length
    native_rows: tuple[torch.Tensor, torch.Tensor] | None = None
    screened: bool = False  # every kept row wants only its argmax: the logits of the tokens that can win


@dataclass(frozen=True)
class KVLayout:
    """What packing needs of the KV cache: its blocks, where it lives and what one head's vector holds."""

    blocks: BlockManager
    device: torch.device
    num_kv_heads: int
    head_dim: int
    kv_dtype: torch.dtype


@dataclass
class PackedRows:
    """The step's fed tokens in order, and which of their rows give logits."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    # M-RoPE's three rows of rotary positions, where a chunk's sequence has them (the others' places thrice)
    rope_rows: list[list[int]] | None = None
    slots: list[int] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)  # a row for each chunk that samples, and for each draft
    context_rows: dict[int, list[int]] = field(default_factory=dict)  # by chunk: the prompt positions to record


def rows_of(chunks: list[ScheduledChunk], blocks: BlockManager) -> PackedRows:
    rows = PackedRows()
    if any(c.seq.rope_positions is not None for c in chunks):
        rows.rope_rows = [[], [], []]
    for index, chunk in enumerate(chunks):
        seq, start = chunk.seq, chunk.seq.num_computed
        end = start + chunk.num_tokens
        offset = len(rows.input_ids)
        rows.input_ids.extend(chunk.fed_tokens)
        rows.positions.extend(range(start, start + chunk.num_fed))
        if rows.rope_rows is not None:
            places = list(range(start, start + chunk.num_fed))
            three = seq.rope_positions.of(start, chunk.num_fed) if seq.rope_positions else [places] * 3
            for row, more in zip(rows.rope_rows, three, strict=True):
                row.extend(more)
        rows.slots.extend(blocks.slot(seq, p) for p in range(start, start + chunk.num_fed))
        if seq.params.wants_prompt_logits:
            wanted = range(max(start, seq.recorded.prompt_positions_seen), min(end, seq.num_prompt_tokens))
            if wanted:
                rows.context_rows[index] = [offset + p - start for p in wanted]
        if chunk.samples:
            last = offset + chunk.num_tokens - 1
            rows.sample_rows.extend(range(last, last + 1 + len(chunk.drafts)))
    return rows


def native_rows(
    chunks: list[ScheduledChunk], blocks: BlockManager, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each fed token as a query of its own: its sequence's block table, and the context it sees (its own
    position and those before it), so a prompt chunk's tokens attend causally."""
    ends = [c.seq.num_computed + c.num_fed for c in chunks]
    needed = [blocks.blocks_needed(end) for end in ends]
    width = max(needed)
    tables, contexts = [], []
    for chunk, end, used in zip(chunks, ends, needed, strict=True):
        table = chunk.seq.block_table[:used] + [0] * (width - used)
        tables.append(torch.tensor([table]).expand(chunk.num_fed, width))
        contexts.append(torch.arange(end - chunk.num_fed + 1, end + 1))
    return torch.cat(tables).to(device), torch.cat(contexts).to(device)


def attention_groups(chunks: list[ScheduledChunk], kv: KVLayout, unpadded_decodes: bool) -> list[AttentionGroup]:
    """The attention groups of a step through transformers' modules: each prompt chunk alone, the decodes together
    (`unpadded_decodes`: the native decode attention takes them without padded queries)."""
    decodes, offset = [], 0
    groups = []
    for chunk in chunks:
        if chunk.num_fed == 1:
            decodes.append((chunk, offset))
        else:
            groups.append(_group([(chunk, offset)], kv, unpadded_decodes))
        offset += chunk.num_fed
    if decodes:
        groups.append(_group(decodes, kv, unpadded_decodes))
    return groups


def _group(members: list[tuple[ScheduledChunk, int]], kv: KVLayout, unpadded_decodes: bool) -> AttentionGroup:
    dev = kv.device
    lens = [c.seq.num_computed + c.num_fed for c, _ in members]
    used = [kv.blocks.blocks_needed(n) for n in lens]
    max_blocks = max(used)
    tables = [c.seq.block_table[:u] + [0] * (max_blocks - u) for (c, _), u in zip(members, used, strict=True)]
    max_q = max(c.num_fed for c, _ in members)
    return AttentionGroup(
        block_index=torch.tensor(tables, dtype=torch.long, device=dev).flatten(),
        context_lens=torch.tensor(lens, device=dev),
        out_index=torch.tensor([o + j for c, o in members for j in range(c.num_fed)], dtype=torch.long, device=dev),
        padded=None if max_q == 1 and unpadded_decodes else _padded(members, max_q, max_blocks, kv),
    )


def _padded(members: list[tuple[ScheduledChunk, int]], max_q: int, max_blocks: int, kv: KVLayout) -> PaddedQueries:
    bs, b = kv.blocks.block_size, len(members)
    query_index = torch.zeros(b, max_q, dtype=torch.long)
    query_positions = torch.zeros(b, 1, max_q, 1, dtype=torch.long)
    causal = torch.zeros(b, 1, max_q, max_blocks * bs, dtype=torch.bool)
    valid = torch.zeros(b, max_q, dtype=torch.bool)
    for i, (chunk, offset) in enumerate(members):
        start, n = chunk.seq.num_computed, chunk.num_fed
        ctx = start + n
        query_index[i, :n] = torch.arange(offset, offset + n)
        query_index[i, n:] = offset + n - 1
        query_positions[i, 0, :n, 0] = torch.arange(start, ctx)
        # Query j sits at position start + j and sees keys 0..start + j.
        causal[i, 0, :n, :ctx] = torch.arange(ctx)[None, :] <= (start + torch.arange(n))[:, None]
        causal[i, 0, n:, 0] = True  # padded rows attend somewhere, so they stay finite
        valid[i, :n] = True
    dev = kv.device
    buffer_shape = (b * max_blocks, bs, kv.num_kv_heads, kv.head_dim)
    return PaddedQueries(
        query_index=query_index.to(dev),
        query_positions=query_positions.to(dev),
        causal=causal.to(dev),
        valid=valid.flatten().to(dev),
        key_buffer=torch.empty(buffer_shape, dtype=kv.kv_dtype, device=dev),
        value_buffer=torch.empty(buffer_shape, dtype=kv.kv_dtype, device=dev),
    )
