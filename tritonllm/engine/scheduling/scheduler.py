"""Decides, step by step, which sequences run and how many of their tokens go into the packed batch.

Every sequence is treated alike: it computes `token_ids[num_computed:]`, in chunks when the step's token
budget is short. A prompt is a long chunk, a decode is a chunk of one, and a preempted sequence simply
recomputes its prompt and outputs later (mostly from the prefix cache); a sequence samples its next token when
a chunk reaches its end.

Order is by rank: priority (1 highest .. 5 lowest), then arrival. Running sequences are served before new ones,
so decodes are never starved by a long prompt, whose prefill is spread over steps by the token budget. While
streams decode, a step's prefill of prompts that arrived after they began is further capped by what the step's
measured cost allows (step_cost.py), so an arriving prompt never stalls them for long; a burst's prompts go in
at the full budget. When
blocks run out, the worst-ranked running sequence is preempted; a waiting sequence may preempt running ones
only of strictly lower priority.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from tritonllm.engine.scheduling.block_manager import BlockManager
from tritonllm.engine.scheduling.step_cost import StepCost
from tritonllm.engine.state.sequence import FinishReason, Sequence, SequenceStatus

BURST_SECONDS = 1.0  # prompts this close to a stream's first token are one burst with it: not capped for it


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_tokens: int
    drafts: list[int] = field(default_factory=list)  # guessed next tokens, fed after the chunk to be verified

    @property
    def samples(self) -> bool:
        """A chunk that reaches the end of the sequence's tokens yields logits for the next token."""
        return self.seq.num_computed + self.num_tokens == len(self.seq.token_ids)

    @property
    def fed_tokens(self) -> list[int]:
        start = self.seq.num_computed
        return self.seq.token_ids[start : start + self.num_tokens] + self.drafts

    @property
    def num_fed(self) -> int:
        return self.num_tokens + len(self.drafts)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        step_cost: StepCost | None = None,
    ) -> None:
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.step_cost = step_cost
        self.burst_seconds = BURST_SECONDS
        self.waiting: list[Sequence] = []  # sorted by rank
        self.running: list[Sequence] = []  # sorted by rank at every step
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        bisect.insort(self.waiting, seq, key=lambda s: s.rank)

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

    def place(self, seq: Sequence, running: bool) -> None:
        """Puts a beam whose state was just replaced where that state belongs: running (it holds blocks) or
        waiting (its parent had been preempted)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING if running else SequenceStatus.WAITING
        if running:
            self.running.append(seq)
        else:
            self.add(seq)

    def schedule(self) -> tuple[list[ScheduledChunk], list[Sequence]]:
        """Returns this step's chunks, and the sequences ended without a token (deadline, or no room ever)."""
        ended = self._expire()
        self._preempt_for_priority()
        budget = self.max_num_batched_tokens
        allowance = self._prefill_allowance()
        prefill_budget = budget if allowance is None else allowance
        chunks: list[ScheduledChunk] = []
        # In rank order, so that a sequence making room preempts only sequences not yet given a chunk.
        self.running.sort(key=lambda s: s.rank)
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted while making room for a better-ranked sequence
            decodes_now = decoding(seq)
            chunk = self._plan(seq, seq.num_computed, budget if decodes_now else min(budget, prefill_budget))
            if chunk is None:
                continue
            if not self._make_room(seq, seq.num_computed + chunk.num_fed):
                if seq.status is SequenceStatus.RUNNING:
                    # Alone in the pool and still too long: it can never continue.
                    self.finish(seq, FinishReason.LENGTH)
                    ended.append(seq)
                continue
            self.blocks.grow(seq, seq.num_computed + chunk.num_fed)
            chunks.append(chunk)
            budget -= chunk.num_fed
            if not decodes_now:
                prefill_budget -= chunk.num_tokens

        for seq in [s for s in self.waiting if s.ready]:
            room = min(budget, prefill_budget)
            if room <= 0:
                break
            prefix, start, chunk = self._first_chunk(seq, room)
            if chunk is None:
                continue
            if not self._fits(prefix, start + chunk.num_fed):
                break  # admission itself never preempts; see _preempt_for_priority
            self.waiting.remove(seq)
            if prefix:
                self.blocks.take_prefix(seq, prefix)
            self.blocks.grow(seq, start + chunk.num_fed)
            seq.status = SequenceStatus.RUNNING
            if seq.timing.first_scheduled_time is None:
                seq.timing.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            chunks.append(chunk)
            budget -= chunk.num_fed
            prefill_budget -= chunk.num_tokens
        return chunks, ended

    def _prefill_allowance(self) -> int | None:
        """The prompt tokens this step may take in beside its decodes (step_cost.py); None: the whole budget.

        The cap protects streams from prompts that arrive while they stream, not from a burst's prompts: requests
        that come within BURST_SECONDS of the streams' first tokens all go in at the full budget (as vLLM takes
        them), so a burst's last first token is not held back by the streams its first prompts started. Through
        Triton's ensemble a burst of 32 reaches the engine over ~0.2 s (the preprocessing model tokenizes one
        request at a time), and the first step starts with the first of them alone. Only a stream that was
        streaming BURST_SECONDS before the oldest prompt still to prefill arrived calls for the cap.
        """
        if self.step_cost is None:
            return None
        decodes = [s for s in self.running if decoding(s)]
        pending = [s.timing.arrival_time for s in self.running if not decoding(s)]
        pending += [s.timing.arrival_time for s in self.waiting if s.ready]
        if not pending:
            return None
        protected_since = min(pending) - self.burst_seconds
        if not any(
            s.timing.first_token_time is not None and s.timing.first_token_time <= protected_since for s in decodes
        ):
            return None
        return self.step_cost.prefill_allowance(len(decodes))

    def _expire(self) -> list[Sequence]:
        now = time.monotonic()
        expired = [s for s in self.sequences() if s.deadline is not None and now >= s.deadline]
        for seq in expired:
            self.finish(seq, FinishReason.TIMEOUT)
        return expired

    def _preempt_for_priority(self) -> None:
        """Makes room for the best waiting sequence by preempting running ones of strictly lower priority."""
        while self.running:
            seq = next((s for s in self.waiting if s.ready), None)
            if seq is None:
                return
            victim = max(self.running, key=lambda s: s.rank)
            if victim.priority <= seq.priority:
                return
            prefix, start, chunk = self._first_chunk(seq, self.max_num_batched_tokens)
            if chunk is None or self._fits(prefix, start + chunk.num_fed):
                return
            self._preempt(victim)

    def _first_chunk(self, seq: Sequence, budget: int) -> tuple[list[int], int, ScheduledChunk | None]:
        """The cached blocks a waiting sequence would start from, where it would start, and its first chunk."""
        prefix = self.blocks.cached_prefix(seq)
        start = len(prefix) * self.blocks.block_size
        return prefix, start, self._plan(seq, start, budget)

    @staticmethod
    def _plan(seq: Sequence, start: int, budget: int) -> ScheduledChunk | None:
        """The next chunk of `seq` from `start`; pending draft tokens ride along only on the chunk that samples.

        A chunk that would sample but has no room for its drafts stops one token short, so that the drafts are
        still verified right after the tokens they continue. The engine's own drafts for a greedy sequence are cut
        to fit instead: its output does not depend on them, where a sampled sequence's random draws do.
        None when nothing fits this step.
        """
        remaining = len(seq.token_ids) - start
        drafts = seq.speculation.draft_tokens
        if seq.params.greedy and not seq.speculation.from_request:
            drafts = drafts[: max(0, budget - remaining)]  # the engine's own guesses: as many as fit
        if drafts and remaining + len(drafts) <= budget:
            return ScheduledChunk(seq, remaining, list(drafts))
        n = min(remaining, budget)
        if drafts and n == remaining:
            n -= 1
        return ScheduledChunk(seq, n) if n > 0 else None

    def _fits(self, prefix: list[int], num_tokens: int) -> bool:
        """Whether a new sequence starting from `prefix` can hold `num_tokens` and join the batch."""
        needed = self.blocks.blocks_needed(num_tokens) - len(prefix)
        return needed <= self.blocks.free_blocks_after_taking(prefix) and len(self.running) < self.max_num_seqs

    def _make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Preempts the worst-ranked running sequences until `seq` fits.

        False when `seq` was preempted itself, or is alone and still does not fit (it stays RUNNING then).
        """
        while not self.blocks.can_hold(seq, num_tokens):
            if self.running == [seq]:
                return False
            victim = max(self.running, key=lambda s: s.rank)
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Drops the sequence's cache; it goes back to the queue and recomputes when readmitted."""
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.WAITING
        self.add(seq)
        self.num_preemptions += 1


def decoding(seq: Sequence) -> bool:
    """Whether the sequence's next chunk is one token after its last sampled one (drafts may ride along)."""
    return seq.status is SequenceStatus.RUNNING and seq.num_computed == len(seq.token_ids) - 1
