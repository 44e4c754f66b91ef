"""Draft tokens from a smaller model that shares the target's tokenizer (speculative=draft_model), for the engine
to verify in a decode step, as vLLM's and llama.cpp's draft-model speculation do.

The draft model has a runner and a KV pool of its own. Each target sequence has a shadow sequence there, which
follows the target's tokens: before drafting, the shadow takes in the target's tokens it has not computed (all
of them the first time, then the one or two a verification added) in one chunk, then proposes its most likely
next token, feeds it, and so on `num_tokens` times. A draft is the draft
model's argmax, so the drafter's distribution puts all its mass on it and the engine's acceptance rule keeps the
target's distribution exactly (sampler._speculative); greedy output is the target's token for token.

A sampled sequence's draws depend on its drafts, so its drafts may depend on nothing but the sequence: the
greedy sequences are drafted for in one batch, each sampled one in a batch of its own (the same shapes whatever
else runs, so the same bits).
"""

from __future__ import annotations

import logging
from pathlib import Path

from tritonllm.engine.execution.model_runner import ModelRunner
from tritonllm.engine.scheduling.block_manager import BlockManager
from tritonllm.engine.scheduling.scheduler import ScheduledChunk
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.formats.hf_folder import load_model_config, load_tokenizer

log = logging.getLogger(__name__)


class DraftModelDrafter:
    def __init__(
        self,
        model_dir: Path,
        target_dir: Path,
        num_tokens: int,
        num_blocks: int,
        block_size: int,
        dtype: str,
        device: str,
    ) -> None:
        check_same_vocabulary(model_dir, target_dir)
        self.num_tokens = num_tokens
        self.blocks = BlockManager(num_blocks, block_size, prefix_caching=False)
        self.runner = ModelRunner(model_dir, self.blocks, dtype, device)
        self._shadows: dict[Sequence, Sequence] = {}
        log.info("speculative draft model %s: %d KV blocks of its own", model_dir, num_blocks)

    def draft(self, rooms: dict[Sequence, int]) -> dict[Sequence, list[int]]:
        """Up to min(num_tokens, room) guessed next tokens for each sequence given with its room."""
        greedy = [seq for seq in rooms if seq.params.greedy]
        batches = [greedy] if greedy else []
        batches += [[seq] for seq in rooms if not seq.params.greedy]
        drafts: dict[Sequence, list[int]] = {}
        for batch in batches:
            drafts.update(self._draft_batch(batch, rooms))
        return drafts

    def _draft_batch(self, seqs: list[Sequence], rooms: dict[Sequence, int]) -> dict[Sequence, list[int]]:
        wanted = {seq: min(self.num_tokens, rooms[seq]) for seq in seqs}
        shadows: dict[Sequence, Sequence] = {}
        for seq in seqs:
            shadow = self._follow(seq)
            end = len(shadow.token_ids) + wanted[seq]
            if self.blocks.can_hold(shadow, end):  # else no drafts this step: the pool is the draft's only
                self.blocks.grow(shadow, end)
                shadows[seq] = shadow
        drafts: dict[Sequence, list[int]] = {seq: [] for seq in shadows}
        feeding = list(shadows)
        while feeding:
            chunks = [ScheduledChunk(shadows[s], len(shadows[s].token_ids) - shadows[s].num_computed) for s in feeding]
            logits, _ = self.runner.forward(chunks)
            for seq, chunk, token in zip(feeding, chunks, logits.argmax(-1).tolist(), strict=True):
                chunk.seq.num_computed += chunk.num_tokens
                chunk.seq.token_ids.append(token)
                drafts[seq].append(token)
            feeding = [seq for seq in feeding if len(drafts[seq]) < wanted[seq]]
        return drafts

    def _follow(self, seq: Sequence) -> Sequence:
        """The sequence's shadow, holding the target's tokens and the K/V of all but the last. A target's tokens
        only grow, and after a verification only its last token can differ from the shadow's (the token drawn in
        place of the first rejected draft, or the one after the last kept), so feeding the target's tokens from
        the last one the shadow may have computed rewrites every position a rejected draft left behind."""
        shadow = self._shadows.get(seq)
        if shadow is None:
            shadow = self._shadows[seq] = Sequence(list(seq.token_ids), SamplingParams())
        shadow.num_computed = min(shadow.num_computed, len(seq.token_ids) - 1)
        shadow.token_ids = list(seq.token_ids)
        return shadow

    def release_finished(self) -> None:
        """Frees the shadows of the sequences that ended (the engine calls it after each step and abort)."""
        for seq in [s for s in self._shadows if s.is_finished]:
            self.blocks.free(self._shadows.pop(seq))


def check_same_vocabulary(model_dir: Path, target_dir: Path) -> None:
    """A draft model's tokens must mean what the target's do, and its ids fit the target's embedding."""
    name = "speculative_model"
    draft, target = load_model_config(model_dir), load_model_config(target_dir)
    if draft["vocab_size"] > target["vocab_size"]:
        raise ValueError(
            f"{name}: its vocabulary ({draft['vocab_size']}) is larger than the model's ({target['vocab_size']})"
        )
    if load_tokenizer(model_dir).get_vocab() != load_tokenizer(target_dir).get_vocab():
        raise ValueError(f"{name}: {model_dir} has another tokenizer than {target_dir}; drafts must share it")
