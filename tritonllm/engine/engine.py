"""The synchronous engine: admit sequences, run steps, report new tokens. Single-threaded by design."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tritonllm.common.errors import RequestError
from tritonllm.engine.config import KV_DTYPE_BYTES, EngineConfig
from tritonllm.engine.decoding.beam_search import BeamSearch
from tritonllm.engine.decoding.logits_processors import ends_with_any, ends_with_stop_word
from tritonllm.engine.decoding.sampler import Sampled, row_argmax, sample_one
from tritonllm.engine.execution.device import resolve_device, resolve_dtype_name
from tritonllm.engine.execution.model_runner import ModelRunner
from tritonllm.engine.layers import lora
from tritonllm.engine.layers.paged_attention import KVCache
from tritonllm.engine.models.model_shape import ModelShape
from tritonllm.engine.scheduling.block_manager import BlockManager
from tritonllm.engine.scheduling.scheduler import ScheduledChunk, Scheduler, decoding
from tritonllm.engine.scheduling.step_cost import StepCost
from tritonllm.engine.speculation.draft_model import DraftModelDrafter
from tritonllm.engine.speculation.ngram_drafter import NgramDrafter
from tritonllm.engine.state.sequence import FinishReason, Sequence
from tritonllm.engine.stats import EngineStats


@dataclass
class StepOutput:
    seq: Sequence
    new_token_ids: list[int]
    batch_size: int  # sequences in the step that produced this output

    @property
    def finished(self) -> bool:
        return self.seq.is_finished


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        shape = ModelShape.of_dir(config.model_dir)
        dtype = resolve_dtype_name(config.dtype, resolve_device(config.device))
        kv_dtype = dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype
        per_block = KVCache.block_bytes(
            shape.num_layers, config.block_size, shape.num_kv_heads, shape.head_dim, KV_DTYPE_BYTES[kv_dtype]
        )
        num_blocks = config.kv_blocks(per_block, shape.max_position_embeddings)
        self.kv_cache_bytes = num_blocks * per_block
        self.blocks = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching, shape.vocab_size)
        self.runner = ModelRunner(
            Path(config.model_dir),
            self.blocks,
            dtype,
            config.device,
            config.enable_lora,
            Path(config.gguf_file) if config.gguf_file and config.quantized_weights else None,
            config.tensor_parallel_size,
            int8_activations=config.int8_activations,
            kv_cache_dtype=kv_dtype,
            greedy_screen=config.greedy_screen,
        )
        self.step_cost = StepCost(slowdown=config.prefill_slowdown)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens, self.step_cost)
        self.stats = EngineStats()
        # Drafts for every sequence with speculative=ngram or draft_model; else only for those that bring a
        # prediction, which the n-gram drafter drafts from either way.
        self.drafter = NgramDrafter(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)
        self.speculate_all = config.speculative != "none"
        self.draft_model = None
        if config.speculative == "draft_model":
            self.draft_model = DraftModelDrafter(
                Path(config.speculative_model),
                Path(config.model_dir),
                config.num_speculative_tokens,
                num_blocks,
                config.block_size,
                dtype,
                config.device,
            )

    @property
    def max_model_len(self) -> int:
        return min(self.runner.shape.max_position_embeddings, self.blocks.num_blocks * self.blocks.block_size)

    def add(self, seq: Sequence) -> None:
        self.validate(seq.prompt_ids, 0 if seq.prompt_table is None else len(seq.prompt_table))
        if seq.rope_positions is not None and self.runner.mrope_section is None:
            raise RequestError("mrope_positions", "mrope_positions: this model's rotary positions are one a token")
        if seq.adapter is not None and self.runner.lora is None:
            raise RequestError("lora_task_id", lora.UNAVAILABLE)
        p = seq.params
        if seq.grammar is not None and (p.beam_width > 1 or seq.speculation.draft_tokens):
            raise RequestError(
                "guided_decoding_guide", "guided_decoding_guide needs beam_width=1 and no draft_input_ids"
            )
        if p.thinking is not None and p.beam_width > 1:  # beams search on the unforced logits
            raise RequestError("thinking_end_ids", "a thinking block is followed with beam_width=1 only")
        if p.beam_width > 1:
            max_tokens = min(p.max_tokens, self.max_model_len - seq.num_prompt_tokens)
            seq.beam = BeamSearch(seq, p.beam_width, p.length_penalty, p.early_stopping, max_tokens)
        self.scheduler.add(seq)

    def validate(self, prompt_ids: list[int], virtual_tokens: int = 0) -> None:
        """Raises ValueError naming `input_ids` for prompts this engine cannot run; safe from any thread.

        `virtual_tokens`: rows of the request's prompt table, which ids from the vocabulary size on select.
        """
        if not prompt_ids:
            raise RequestError("input_ids", "input_ids is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestError(
                "input_ids",
                f"input_ids has {len(prompt_ids)} tokens; this model takes at most {self.max_model_len - 1}",
            )
        limit = self.runner.shape.vocab_size + virtual_tokens
        bad = [t for t in prompt_ids if not 0 <= t < limit]
        if bad:
            raise RequestError("input_ids", f"input_ids holds token ids outside [0, {limit}): {bad[:5]}")

    def abort(self, seq: Sequence, reason: FinishReason = FinishReason.CANCELLED) -> None:
        for s in seq.beam.live if seq.beam is not None else [seq]:
            if not s.is_finished:
                self.scheduler.finish(s, reason)
        if self.draft_model is not None:
            self.draft_model.release_finished()

    def close(self) -> None:
        """Ends the other ranks of a tensor-parallel engine."""
        self.runner.close()

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @property
    def last_batch_size(self) -> int:
        return self.stats.last_batch_size

    def step(self) -> list[StepOutput]:
        started = time.perf_counter()
        self._draft()
        chunks, ended = self.scheduler.schedule()
        outputs = [StepOutput(seq, [], self.last_batch_size) for seq in self._end_searches(ended)]
        if chunks:
            self._count_step(chunks)
            outputs += self._run(chunks)
            self.step_cost.observe(sum(c.num_fed for c in chunks), time.perf_counter() - started)
        if self.draft_model is not None:  # sequences this step ended, in scheduling or after their tokens
            self.draft_model.release_finished()
        return outputs

    def _draft(self) -> None:
        """Drafts for the decoding sequences that can take them. Not for beam search or grammars (one token
        at a time), nor for a request that brought drafts of its own (it is told how many of those were kept)."""
        running = self.scheduler.running
        measured = self.step_cost.token_share(len(running))
        for_draft_model: dict[Sequence, int] = {}
        for seq in running:
            if not (self.speculate_all or seq.speculation.prediction):
                continue
            if (
                seq.speculation.draft_tokens
                or seq.speculation.from_request
                or seq.beam
                or seq.grammar
                or not decoding(seq)
            ):
                continue
            # drafts never run past the request's max_tokens, the model's context or a step's token budget
            room = min(
                seq.params.max_tokens - seq.num_output_tokens - 1,
                self.max_model_len - len(seq.token_ids) - 1,
                self.scheduler.max_num_batched_tokens - 1,
            )
            if room <= 0:
                continue
            if self.draft_model is not None and not seq.speculation.prediction:
                if seq.prompt_table is None and seq.adapter is None:  # the draft model knows neither
                    for_draft_model[seq] = room
                continue
            # A sampled sequence's draws depend on its drafts, so they may depend on nothing but the sequence
            # itself (its seed makes it reproducible in any batch): not on the measured step times.
            share = measured if seq.params.greedy else None
            seq.speculation.draft_tokens = self.drafter.draft(seq, room, share)
        if for_draft_model:
            for seq, drafts in self.draft_model.draft(for_draft_model).items():
                seq.speculation.draft_tokens = drafts

    def _run(self, chunks: list[ScheduledChunk]) -> list[StepOutput]:
        """The forward pass of the step's chunks, then each sampling chunk's next token (or beam step)."""
        outputs: list[StepOutput] = []
        sampling = [c for c in chunks if c.samples]
        logits, context_logits = self.runner.forward(chunks)
        for index, rows in context_logits.items():
            self._record_prompt(chunks[index].seq, rows)
        for chunk in chunks:
            chunk.seq.num_computed += chunk.num_tokens
            self.blocks.register_full_blocks(chunk.seq)
        argmax = row_argmax(logits)
        now, row = time.monotonic(), 0
        searches = []
        for chunk in sampling:
            search = chunk.seq.beam
            if search is None:
                outputs.append(StepOutput(chunk.seq, self._sample(chunk, logits, argmax, row, now), len(chunks)))
            elif search.offer(chunk.seq, logits[row]):
                searches.append(search)
            row += 1 + len(chunk.drafts)
        for search in searches:
            if self._advance(search, now):
                outputs.append(StepOutput(search.lead, [], len(chunks)))
        return outputs

    def _advance(self, search: BeamSearch, now: float) -> bool:
        """One beam search step. The next live beams take over their parents' tokens and KV blocks (shared,
        copied on write); the request's own sequence stays one of them. True when the search is done."""
        chosen = search.step()
        if search.done:
            best = search.results()[0]
            reason = FinishReason.END_ID if best.output_ids[-1] == search.lead.params.end_id else FinishReason.LENGTH
            if search.lead.params.stop_words and ends_with_any(best.output_ids, search.lead.params.stop_words):
                reason = FinishReason.STOP_WORDS
            self.abort(search.lead, reason)
            return True
        states = [
            (
                c.parent.token_ids + [c.token],
                self.blocks.share(c.parent),
                c.parent.num_computed,
                list(c.parent.block_hashes),
            )
            for c in chosen
        ]
        beams = [search.lead, *(s for s in search.live if s is not search.lead)]
        beams += [search.lead.fork() for _ in range(len(chosen) - len(beams))]
        for seq in search.live:
            self.blocks.free(seq)
        for seq in beams[len(chosen) :]:
            self.scheduler.finish(seq, FinishReason.LENGTH)
        for seq, (tokens, table, num_computed, hashes) in zip(beams, states, strict=False):
            seq.token_ids, seq.block_table, seq.num_computed, seq.block_hashes = tokens, table, num_computed, hashes
            self.scheduler.place(seq, running=bool(table))
        search.continue_with(beams[: len(chosen)], chosen)
        self._observe_latency(search.lead, now)
        return False

    def _end_searches(self, ended: list[Sequence]) -> list[Sequence]:
        """A beam that had to end (deadline, no room) ends its whole search, reported once for the request."""
        reported = []
        for seq in ended:
            if seq.beam is not None:
                self.abort(seq.beam.lead, seq.finish_reason)
                seq = seq.beam.lead
            if seq not in reported:
                reported.append(seq)
        return reported

    def _sample(self, chunk: ScheduledChunk, logits: torch.Tensor, argmax: list[int], row: int, now: float):
        """Samples the chunk's next token, or verifies its drafts: every accepted draft plus one more token."""
        seq, drafts, new = chunk.seq, chunk.drafts, []
        if drafts:
            seq.speculation.accepted_drafts = 0
        for i in range(len(drafts) + 1):
            draft = drafts[i] if i < len(drafts) else None
            sampled = sample_one(logits[row + i], seq, argmax[row + i], draft)
            self._record(seq, sampled, logits[row + i])
            self._observe_latency(seq, now)
            new.append(sampled.token)
            reason = self._finish_reason(seq, sampled.token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                break
            if draft is None or sampled.token != draft:
                break
            seq.speculation.accepted_drafts += 1
            seq.num_computed += 1  # the draft's K/V, computed in this pass, now belongs to the sequence
        if drafts:
            seq.speculation.draft_tokens, seq.speculation.draft_logits = [], None
            self.stats.verifications += 1
            self.stats.draft_tokens += len(drafts)
            self.stats.accepted_draft_tokens += seq.speculation.accepted_drafts
            seq.counts.draft_tokens += len(drafts)
            seq.counts.accepted_draft_tokens += seq.speculation.accepted_drafts
            if not seq.speculation.from_request:
                self.drafter.verified(seq, len(drafts), seq.speculation.accepted_drafts)
                if seq.speculation.prediction:
                    seq.speculation.accepted_prediction_tokens += seq.speculation.accepted_drafts
        return new

    def _count_step(self, chunks: list[ScheduledChunk]) -> None:
        stats = self.stats
        stats.steps += 1
        stats.last_batch_size = len(chunks)
        stats.last_step_tokens = sum(c.num_tokens for c in chunks)
        for chunk in chunks:
            seq = chunk.seq
            if seq.timing.last_token_time is None:
                stats.prompt_tokens += seq.num_prompt_tokens
                seq.timing.last_token_time = (
                    seq.timing.arrival_time
                )  # started; the first token's latency counts from arrival

    def _observe_latency(self, seq: Sequence, now: float) -> None:
        stats = self.stats
        stats.generation_tokens += 1
        if seq.num_output_tokens == 1:
            seq.timing.first_token_time = now
            stats.time_to_first_token.append(now - seq.timing.arrival_time)
            stats.queue_time.append(seq.queue_wait())
        else:
            stats.inter_token_latency.append(now - seq.timing.last_token_time)
        seq.timing.last_token_time = now

    @staticmethod
    def _record_prompt(seq: Sequence, rows: torch.Tensor) -> None:
        """The logits of prompt positions from `seq.recorded.prompt_positions_seen` on: kept whole, or reduced at once
        to the log-probabilities of the prompt tokens they predict, so a long prompt never holds [prompt, vocab]."""
        p, first = seq.params, seq.recorded.prompt_positions_seen
        seq.recorded.prompt_positions_seen += len(rows)
        if p.return_context_logits:
            seq.recorded.context_logits.extend(rows)
        predicted = seq.prompt_ids[first + 1 : first + 1 + len(rows)]  # the last position predicts the output
        if not p.return_prompt_log_probs or not predicted:
            return
        logprobs = torch.log_softmax(rows[: len(predicted)], -1)
        predicted_ids = torch.tensor(predicted, device=logprobs.device)
        chosen = logprobs[torch.arange(len(predicted)), predicted_ids]
        seq.recorded.prompt_logprobs += chosen.tolist()
        seq.recorded.prompt_ranks += ((logprobs > chosen[:, None]).sum(-1) + 1).tolist()
        if p.top_log_probs:
            top = torch.topk(logprobs, p.top_log_probs)
            seq.recorded.prompt_top_logprobs += list(zip(top.indices.tolist(), top.values.tolist(), strict=True))

    @staticmethod
    def _record(seq: Sequence, sampled: Sampled, raw_logits: torch.Tensor) -> None:
        seq.token_ids.append(sampled.token)
        answer = seq.thinking is None or seq.thinking.advance(sampled.token)
        if seq.grammar is not None and answer:
            seq.grammar.advance(sampled.token)
        if sampled.logprob is not None:
            seq.recorded.logprobs.append(sampled.logprob)
        if sampled.top_ids is not None:
            seq.recorded.top_logprobs.append((sampled.top_ids, sampled.top_logprobs))
        if seq.params.return_generation_logits:
            seq.recorded.generation_logits.append(raw_logits.clone())

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        if token == seq.params.end_id or (seq.grammar is not None and seq.grammar.finished):
            return FinishReason.END_ID
        if seq.params.stop_words and ends_with_stop_word(seq):
            return FinishReason.STOP_WORDS
        if seq.num_output_tokens >= seq.params.max_tokens or len(seq.token_ids) >= self.max_model_len:
            return FinishReason.LENGTH
        return None
