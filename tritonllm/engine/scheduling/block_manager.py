"""Hands out fixed-size KV cache blocks from one pool; a sequence's block table maps its positions to slots.

Full blocks are shared by prefix: each is named by a hash chained over every token up to its end, so two
sequences that share a prefix share its blocks (reference counted). A block whose last user is gone keeps its
contents and its name in a least-recently-freed queue, so a later request (or a preempted sequence coming back)
can take it again until it is reused for something else.

A prompt-table id (from the vocabulary size on: media rows, p-tuning) is named by a digest of the row it
selects, not by the id, which is only a row's place: two prompts with the same text and different images share
no block, and a later turn of a chat about the same image shares all of them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from tritonllm.engine.state.sequence import Sequence


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, prefix_caching: bool = True, vocab_size: int = 1 << 62
    ) -> None:
        self.num_blocks = num_blocks
        self.vocab_size = vocab_size  # ids from here on select prompt-table rows
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._refs = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # oldest first
        self._hash_of: dict[int, int] = {}
        self._block_of: dict[int, int] = {}
        self.prefix_hit_tokens = 0
        self.prefix_queried_tokens = 0
        # (source, destination) block pairs that the model runner copies before the next forward pass
        self.pending_copies: list[tuple[int, int]] = []

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
        missing = self.blocks_needed(num_tokens) - len(seq.block_table) + self._shares_next_block(seq)
        return missing <= len(self._free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Gives `seq` room for `num_tokens`, and a copy of the block it writes next if that one is shared."""
        missing = self.blocks_needed(num_tokens) - len(seq.block_table)
        if missing + self._shares_next_block(seq) > len(self._free):
            raise RuntimeError(f"KV pool exhausted: need {missing} blocks, {len(self._free)} free")
        if self._shares_next_block(seq):
            index = seq.num_computed // self.block_size
            shared = seq.block_table[index]
            self._refs[shared] -= 1
            seq.block_table[index] = self._take()
            self.pending_copies.append((shared, seq.block_table[index]))
        for _ in range(missing):
            seq.block_table.append(self._take())

    def share(self, seq: Sequence) -> list[int]:
        """A copy of `seq`'s block table whose blocks now have one more user (a beam forked from `seq`)."""
        for block in seq.block_table:
            self._refs[block] += 1
        return list(seq.block_table)

    def _take(self) -> int:
        block, _ = self._free.popitem(last=False)
        self._forget(block)
        self._refs[block] = 1
        return block

    def _shares_next_block(self, seq: Sequence) -> bool:
        """Whether the partly filled block that `seq` writes next has other users, so it must be copied first."""
        index, offset = divmod(seq.num_computed, self.block_size)
        return offset > 0 and index < len(seq.block_table) and self._refs[seq.block_table[index]] > 1

    def free(self, seq: Sequence) -> None:
        seq.counts.held_blocks = max(seq.counts.held_blocks, len(seq.block_table))
        for block in reversed(seq.block_table):  # the prefix's first blocks are evicted last
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
        seq.block_table = []
        seq.num_computed = 0
        seq.block_hashes = []

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    # Prefix caching

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the start of a sequence that has none yet (its last token is left to compute)."""
        if not self.prefix_caching or seq.block_table or seq.params.wants_prompt_logits:
            return []
        hashes = self._hashes(self._named(seq, seq.token_ids[: len(seq.token_ids) - 1]), seq.kv_namespace)
        found = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def free_blocks_after_taking(self, blocks: list[int]) -> int:
        return len(self._free) - sum(1 for b in blocks if self._refs[b] == 0)

    def take_prefix(self, seq: Sequence, blocks: list[int]) -> None:
        for block in blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
        seq.block_table = list(blocks)
        seq.block_hashes = [self._hash_of[b] for b in blocks]
        seq.num_computed = len(blocks) * self.block_size
        seq.counts.reused_blocks = len(blocks)
        seq.counts.cached_tokens = seq.num_computed
        self.prefix_queried_tokens += len(seq.token_ids)
        self.prefix_hit_tokens += seq.num_computed

    def register_full_blocks(self, seq: Sequence) -> None:
        """Names the blocks that `seq` has filled since the last call, so later requests can share them."""
        if not self.prefix_caching:
            return
        full = seq.num_computed // self.block_size
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            previous = seq.block_hashes[-1] if seq.block_hashes else _root(seq.kv_namespace)
            bs = self.block_size
            h = self._chain(previous, self._named(seq, seq.token_ids[i * bs : (i + 1) * bs]))
            seq.block_hashes.append(h)
            block = seq.block_table[i]
            if h not in self._block_of and block not in self._hash_of:
                self._block_of[h] = block
                self._hash_of[block] = h

    def _named(self, seq: Sequence, tokens: list[int]) -> list:
        """`tokens` as the cache names them: a prompt-table id by the digest of its row."""
        if seq.prompt_table is None:
            return tokens
        if seq.prompt_row_digests is None:
            rows = seq.prompt_table.contiguous()
            seq.prompt_row_digests = [hashlib.blake2b(r.numpy().tobytes(), digest_size=16).digest() for r in rows]
        vocab, digests = self.vocab_size, seq.prompt_row_digests
        return [t if t < vocab else digests[t - vocab] for t in tokens]

    def _hashes(self, tokens: list, namespace: int | None) -> list[int]:
        hashes: list[int] = []
        bs = self.block_size
        for i in range(len(tokens) // bs):
            hashes.append(self._chain(hashes[-1] if hashes else _root(namespace), tokens[i * bs : (i + 1) * bs]))
        return hashes

    @staticmethod
    def _chain(previous, block: list) -> int:
        """The name of a block: its tokens and, through `previous`, everything before."""
        return hash((previous, tuple(block)))

    def _forget(self, block: int) -> None:
        h = self._hash_of.pop(block, None)
        if h is not None:
            del self._block_of[h]


def _root(namespace: int | None) -> tuple:
    """Where a sequence's hash chain starts: blocks are shared only between sequences of one namespace."""
    return ("namespace", namespace)
