"""Decides, step by step, which sequences run and how many of their tokens go into the packed batch.

Every sequence is treated alike: it computes `token_ids[num_computed:]`, in chunks when the step's token
budget is short. A prompt is a long chunk, a decode is a chunk of one, and a preempted sequence simply
recomputes its prompt and outputs later; a sequence samples its next token when a chunk reaches its end.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager
from .sequence import FinishReason, Sequence, SequenceStatus


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_tokens: int

    @property
    def samples(self) -> bool:
        """A chunk that reaches the end of the sequence's tokens yields logits for the next token."""
        return self.seq.num_computed + self.num_tokens == len(self.seq.token_ids)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def sequences(self) -> list[Sequence]:
        return [*self.running, *self.waiting]

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Ends `seq` wherever it is (running, queued, or never admitted) and returns its blocks to the pool."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def schedule(self) -> tuple[list[ScheduledChunk], list[Sequence]]:
        """Returns this step's chunks, and sequences that had to be ended because the pool cannot hold them."""
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        overflowed: list[Sequence] = []
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted while making room for an earlier sequence
            n = min(seq.num_uncomputed, budget)
            if not self._make_room(seq, seq.num_computed + n):
                if seq.status is SequenceStatus.RUNNING:
                    # Alone in the pool and still too long: it can never continue.
                    self.finish(seq, FinishReason.LENGTH)
                    overflowed.append(seq)
                continue
            self.blocks.grow(seq, seq.num_computed + n)
            chunks.append(ScheduledChunk(seq, n))
            budget -= n

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = min(seq.num_uncomputed, budget)
            if not self.blocks.can_hold(seq, seq.num_computed + n):
                break  # admission never preempts; it waits for blocks to come back
            self.waiting.popleft()
            self.blocks.grow(seq, seq.num_computed + n)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            chunks.append(ScheduledChunk(seq, n))
            budget -= n
        return chunks, overflowed

    def _make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Preempts the most recently admitted sequences until `seq` fits.

        False when `seq` was preempted itself, or is alone and still does not fit (it stays RUNNING then).
        """
        while not self.blocks.can_hold(seq, num_tokens):
            if self.running == [seq]:
                return False
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Drops the sequence's cache; it goes to the front of the queue and recomputes when readmitted."""
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
