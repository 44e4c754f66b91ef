"""Turns each sequence's next-token logits into a token: greedy, or temperature / top-k / top-p sampling."""

from __future__ import annotations

import torch

from .sequence import Sequence


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


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """logits: [len(seqs), vocab] float32."""
    tokens = logits.argmax(-1).tolist()
    for i, seq in enumerate(seqs):
        p = seq.params
        if p.greedy:
            continue
        probs = warp(logits[i], p.temperature, p.top_k, p.top_p).softmax(-1)
        tokens[i] = int(torch.multinomial(probs, 1, generator=seq.generator))
    return tokens
