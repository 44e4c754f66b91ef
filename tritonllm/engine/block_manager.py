"""Hands out fixed-size KV cache blocks from one pool; a sequence's block table maps its positions to slots."""

from __future__ import annotations

from collections import deque

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_hold(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether `seq` can grow to `num_tokens` cached tokens with the free blocks left."""
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= len(self._free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        missing = self.blocks_needed(num_tokens) - len(seq.block_table)
        if missing > len(self._free):
            raise RuntimeError(f"KV pool exhausted: need {missing} blocks, {len(self._free)} free")
        for _ in range(missing):
            seq.block_table.append(self._free.popleft())

    def free(self, seq: Sequence) -> None:
        self._free.extend(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
