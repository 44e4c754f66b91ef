"""One request's state as it moves through the engine."""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import torch

from tritonllm.common.request_parameters import DEFAULT_PRIORITY
from tritonllm.engine.layers.lora import Adapter
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.thinking_block import ThinkingTracker

_next_seq_id = itertools.count()


@dataclass
class KvAndDraftCounts:
    """What TensorRT-LLM's per-request perf metrics report beside the timings (return_perf_metrics)."""

    reused_blocks: int = 0  # KV blocks taken from the prefix cache
    cached_tokens: int = 0  # the prompt's tokens those blocks hold
    held_blocks: int = 0  # the most KV blocks it held (read when they are freed)
    draft_tokens: int = 0  # drafts verified, over the whole generation
    accepted_draft_tokens: int = 0


@dataclass
class Speculation:
    """Guessed next tokens verified in one step, then cleared: the request's own or a drafter's, with the drafter's
    logits for them where it has them; and OpenAI's Predicted Outputs, text the answer is expected to repeat,
    drafted from (ngram_drafter.py)."""

    draft_tokens: list[int] = field(default_factory=list)
    draft_logits: torch.Tensor | None = None  # [len(draft_tokens), vocab]
    accepted_drafts: int = 0  # of the last verification
    prediction: list[int] = field(default_factory=list)
    accepted_prediction_tokens: int = 0
    from_request: bool = False  # the request brought its drafts: the engine drafts no more for it


@dataclass
class Timing:
    """When the sequence arrived, was first scheduled, began to stream and last streamed (time.monotonic())."""

    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None  # when it began to stream (the scheduler's prefill cap protects it)
    last_token_time: float | None = None  # set when it first runs, then at every token


@dataclass
class Recorded:
    """What the request asked to get back beside its tokens (see SamplingParams)."""

    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)
    prompt_positions_seen: int = 0  # prompt positions whose logits were recorded (survives preemption)
    context_logits: list[torch.Tensor] = field(default_factory=list)  # one [vocab] row per prompt position
    # From the second prompt token on: its log-probability, and the best alternatives, given the tokens before.
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_ranks: list[int] = field(default_factory=list)  # each one's place among the vocabulary, 1 the likeliest
    prompt_top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)
    generation_logits: list[torch.Tensor] = field(default_factory=list)  # one [vocab] row per output token


class BeamGroup(Protocol):
    """The beam search whose live beams are Sequences (beam_search.BeamSearch), as the engine and the responses
    reach it through a beam; declared here because the search itself is built on Sequence."""

    lead: Sequence  # the request's own sequence
    live: list[Sequence]

    def offer(self, seq: Sequence, logits: torch.Tensor) -> bool: ...

    def results(self) -> list: ...


class Grammar(Protocol):
    """The matcher constraining one sequence's next tokens (decoding/grammar.py's), as the sampler and the engine
    reach it through the sequence; declared here because decoding is built on Sequence."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor: ...

    def advance(self, token: int) -> None: ...

    @property
    def finished(self) -> bool: ...


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, Enum):
    END_ID = "end_id"  # the request's end token was generated
    LENGTH = "length"  # request_output_len, or the model's / the KV pool's capacity
    STOP_WORDS = "stop_words"  # the output ended with one of the request's stop words
    TIMEOUT = "timeout"  # the request's deadline passed first
    CANCELLED = "cancelled"
    ERROR = "error"  # the engine failed while serving it


@dataclass(frozen=True)
class RopePositions:
    """M-RoPE (Qwen2-VL): each prompt token's (temporal, height, width) rotary positions; a token past the prompt
    sits at its index + `delta` on all three (the media tokens take fewer positions than places)."""

    prompt: torch.Tensor  # [3, prompt length], long
    delta: int

    def of(self, start: int, count: int) -> list[list[int]]:
        """The three rotary positions of the tokens at places start .. start + count - 1."""
        known = self.prompt[:, start : start + count].tolist()
        beyond = list(range(max(start, self.prompt.shape[1]) + self.delta, start + count + self.delta))
        return [row + beyond for row in known]


@dataclass(eq=False)
class Sequence:
    """One request's sample (or one live beam): what it is fed, where its KV blocks are, how it is scheduled;
    its speculation, timings and recorded outputs are groups of their own."""

    prompt_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    seq_id: int = field(default_factory=lambda: next(_next_seq_id))
    token_ids: list[int] = field(init=False)
    num_computed: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # names of the full blocks, for prefix sharing
    priority: int = DEFAULT_PRIORITY  # 1 highest .. 5 lowest
    deadline: float | None = None  # time.monotonic() after which it ends with TIMEOUT
    # Samples of one request: index within the request, and the sibling whose prompt this one waits for, so
    # that it starts from that sibling's cached prompt blocks instead of computing them again.
    sample_index: int = 0
    after: Sequence | None = None
    speculation: Speculation = field(default_factory=Speculation)
    # P-tuning: prompt ids from the vocabulary size on select rows of this [rows, hidden] table.
    prompt_table: torch.Tensor | None = None
    prompt_row_digests: list[bytes] | None = None  # each table row's, for prefix caching (block_manager.py)
    rope_positions: RopePositions | None = None  # M-RoPE's, for a prompt with media; None: each token's place
    adapter: Adapter | None = None  # LoRA
    beam: BeamGroup | None = None  # the search this sequence is a live beam of
    grammar: Grammar | None = None  # constrains which tokens may come next
    thinking: ThinkingTracker | None = field(init=False, default=None)  # with params.thinking
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    timing: Timing = field(default_factory=Timing)
    counts: KvAndDraftCounts = field(default_factory=KvAndDraftCounts)
    generator: torch.Generator | None = field(init=False, default=None)
    recorded: Recorded = field(init=False, default_factory=Recorded)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_ids)
        self.speculation.from_request = bool(self.speculation.draft_tokens)  # the engine drafts no more for it
        block = self.params.thinking
        self.thinking = None if block is None else ThinkingTracker(block)

    def random_stream(self, device: torch.device) -> torch.Generator:
        """This sequence's own random stream, on the device its logits are on: its samples do not depend on what
        else is batched. Made at the first draw, seeded from params.seed (else from the OS)."""
        if self.generator is None:
            self.generator = torch.Generator(device)
            if self.params.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(self.params.seed)
        return self.generator

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def kv_namespace(self) -> int | None:
        """Whose weights made its K/V: prefix blocks are shared only within one namespace."""
        return None if self.adapter is None else self.adapter.task_id

    @property
    def ready(self) -> bool:
        """Whether it may be admitted: a sample waits until its sibling's prompt is in the cache."""
        first = self.after
        return first is None or first.is_finished or first.num_computed >= first.num_prompt_tokens

    @property
    def rank(self) -> tuple[int, int, int]:
        """Smaller runs first: higher priority, then earlier arrival; the beams of a search rank together."""
        request = self.seq_id if self.beam is None else self.beam.lead.seq_id
        return (self.priority, request, self.seq_id)

    def fork(self) -> Sequence:
        """Another live beam of this sequence's search (the search gives it tokens and blocks)."""
        return Sequence(
            self.prompt_ids,
            self.params,
            request_id=self.request_id,
            priority=self.priority,
            deadline=self.deadline,
            prompt_table=self.prompt_table,
            prompt_row_digests=self.prompt_row_digests,
            rope_positions=self.rope_positions,
            adapter=self.adapter,
            beam=self.beam,
            timing=Timing(self.timing.arrival_time, self.timing.first_scheduled_time, self.timing.first_token_time),
        )

    @property
    def rejected_prediction_tokens(self) -> int:
        """The prediction's tokens that did not become output through a kept draft (OpenAI's usage field)."""
        return max(0, len(self.speculation.prediction) - self.speculation.accepted_prediction_tokens)

    def queue_wait(self) -> float:
        """Seconds from arrival to first scheduling (0 while still waiting)."""
        if self.timing.first_scheduled_time is None:
            return 0.0
        return self.timing.first_scheduled_time - self.timing.arrival_time


def samples_of(prompt_ids: list[int], params: SamplingParams, n: int, **fields) -> list[Sequence]:
    """`n` samples of one prompt. The first computes the prompt; the others start from its cached blocks.

    With a seed, sample i draws from seed + i, so the samples differ and each is reproducible.
    """
    speculation = fields.pop("speculation", None) or Speculation()
    samples: list[Sequence] = []
    for i in range(n):
        own = (
            params if params.seed is None or i == 0 else dataclasses.replace(params, seed=(params.seed + i) % (1 << 64))
        )
        mine = dataclasses.replace(speculation, draft_tokens=list(speculation.draft_tokens))  # each counts its own
        after = samples[0] if samples else None
        samples.append(Sequence(prompt_ids, own, sample_index=i, after=after, speculation=mine, **fields))
    return samples
