"""Per-sequence logits processing before sampling, equal to transformers' processors on the same inputs.

Order, as in transformers' generate(): embedding bias (SequenceBias), repetition penalty, presence and
frequency penalties, no-repeat n-grams, bad words, min tokens. Temperature, top-k and top-p follow in the
sampler.
"""

from __future__ import annotations

import torch

from tritonllm.engine.state.sequence import Sequence

NEG_INF = float("-inf")


def process(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """logits: [vocab] float32 for `seq`'s next token; returns the processed copy."""
    p = seq.params
    if not p.processes_logits:
        return logits
    logits = logits.clone()
    vocab = logits.shape[0]
    tokens = torch.tensor(seq.token_ids, dtype=torch.long, device=logits.device)
    tokens = tokens[tokens < vocab]  # p-tuning's virtual prompt ids have no logits
    if p.embedding_bias is not None:
        logits += p.embedding_bias.to(logits.device)
    if p.repetition_penalty != 1.0:
        seen = logits[tokens]
        logits[tokens] = torch.where(seen < 0, seen * p.repetition_penalty, seen / p.repetition_penalty)
    if p.presence_penalty or p.frequency_penalty:
        output = tokens[seq.num_prompt_tokens :]
        if len(output):
            counts = torch.bincount(output, minlength=logits.shape[0]).to(logits.dtype)
            logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    if p.no_repeat_ngram_size:
        banned = [t for t in banned_ngram_tokens(seq.token_ids, p.no_repeat_ngram_size) if t < vocab]
        if banned:
            logits[banned] = NEG_INF
    if p.bad_words:
        banned = [w[-1] for w in p.bad_words if len(w) == 1 or _ends_with(seq.token_ids, w[:-1])]
        if banned:
            logits[banned] = NEG_INF
    if p.min_tokens and seq.num_output_tokens < p.min_tokens and 0 <= p.end_id < vocab:
        logits[p.end_id] = NEG_INF
    return logits


def banned_ngram_tokens(tokens: list[int], n: int) -> set[int]:
    """Tokens that would complete an n-gram already present in `tokens`."""
    if len(tokens) + 1 < n:
        return set()
    prefix = tuple(tokens[len(tokens) - n + 1 :]) if n > 1 else ()
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i : i + n - 1]) == prefix}


def _ends_with(tokens: list[int], suffix: list[int]) -> bool:
    return len(tokens) >= len(suffix) and tokens[len(tokens) - len(suffix) :] == suffix


def ends_with_stop_word(seq: Sequence) -> bool:
    return ends_with_any(seq.output_ids, seq.params.stop_words)


def ends_with_any(tokens: list[int], words: list[list[int]]) -> bool:
    return matched_word(tokens, words) is not None


def matched_word(tokens: list[int], words: list[list[int]]) -> list[int] | None:
    """The longest of `words` that `tokens` ends with."""
    found = [word for word in words if _ends_with(tokens, word)]
    return max(found, key=len) if found else None
