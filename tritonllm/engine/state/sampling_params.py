"""Per-request decoding settings, already validated by the caller."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonllm.engine.state.thinking_block import ThinkingBlock

NO_END_ID = -1


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means the whole vocabulary
    top_p: float = 1.0
    typical_p: float = 1.0
    min_p: float = 0.0
    watermark: bool = False  # see sampler.watermark
    seed: int | None = None
    end_id: int = NO_END_ID
    pad_id: int = 0  # fills the shorter beams of a response
    # Logits processing, in transformers' order (see logits_processors.py).
    embedding_bias: torch.Tensor | None = None  # [vocab], added to the logits
    repetition_penalty: float = 1.0  # over prompt and output, as transformers
    presence_penalty: float = 0.0  # over output tokens, as OpenAI and vLLM
    frequency_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    bad_words: list[list[int]] = field(default_factory=list)
    min_tokens: int = 0  # end_id is banned until this many tokens were generated
    stop_words: list[list[int]] = field(default_factory=list)  # generation ends after any of these
    thinking: ThinkingBlock | None = None  # a reasoning model's thinking block, followed (thinking_block.py)
    # Beam search (beam_width > 1), with transformers' rules: see beam_search.py.
    beam_width: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = True  # True, False or "never"
    # What to report back.
    return_log_probs: bool = False
    top_log_probs: int = 0  # alternatives per token, with their log-probabilities
    return_context_logits: bool = False
    return_generation_logits: bool = False
    # Each prompt token's log-probability given what precedes it (and top_log_probs alternatives), as OpenAI's
    # completions give with echo and logprobs: how lm-eval and every log-likelihood benchmark score a model.
    return_prompt_log_probs: bool = False
    return_prompt_ids: bool = False  # the prompt's ids, in the first response

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def wants_prompt_logits(self) -> bool:
        """Whether the prompt positions' logits must be computed here, so none may come from the prefix cache."""
        return self.return_context_logits or self.return_prompt_log_probs

    @property
    def processes_logits(self) -> bool:
        return bool(
            self.embedding_bias is not None
            or self.repetition_penalty != 1.0
            or self.presence_penalty
            or self.frequency_penalty
            or self.no_repeat_ngram_size
            or self.bad_words
            or self.min_tokens
        )
