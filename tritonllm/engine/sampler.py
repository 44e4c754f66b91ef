"""Turns each sequence's next-token logits into a token: greedy, or temperature / top-k / top-p sampling.

Log-probabilities are reported from the model's unprocessed logits (log-softmax before penalties and
warpers), so they describe the model, not the request's decoding settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .logits_processors import process
from .sequence import Sequence


@dataclass
class Sampled:
    token: int
    logprob: float | None = None
    top_ids: list[int] | None = None
    top_logprobs: list[float] | None = None


def warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p, in the order and with the tie rules of transformers' warpers."""
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative <= 1 - top_p
        remove[-1] = False  # always keep the most likely token
        logits = logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[Sampled]:
    """logits: [len(seqs), vocab] float32, unprocessed."""
    tokens = logits.argmax(-1).tolist()
    wants_logprobs = any(s.params.return_log_probs or s.params.top_log_probs for s in seqs)
    logprobs = torch.log_softmax(logits, -1) if wants_logprobs else None
    out = []
    for i, seq in enumerate(seqs):
        p = seq.params
        raw = logits[i]
        row = process(raw, seq)
        if p.greedy:
            token = tokens[i] if row is raw else int(row.argmax())
        else:
            probs = warp(row, p.temperature, p.top_k, p.top_p).softmax(-1)
            token = int(torch.multinomial(probs, 1, generator=seq.generator))
        result = Sampled(token)
        if p.return_log_probs:
            result.logprob = float(logprobs[i, token])
        if p.top_log_probs:
            top = torch.topk(logprobs[i], p.top_log_probs)
            result.top_ids, result.top_logprobs = top.indices.tolist(), top.values.tolist()
        out.append(result)
    return out
