"""Turns each sequence's next-token logits into a token: greedy, or temperature / top-k / top-p sampling.

Log-probabilities are reported from the model's unprocessed logits (log-softmax before penalties and
warpers), so they describe the model, not the request's decoding settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tritonllm.engine.decoding.logits_processors import process
from tritonllm.engine.state.sequence import Sequence


@dataclass
class Sampled:
    token: int
    logprob: float | None = None
    top_ids: list[int] | None = None
    top_logprobs: list[float] | None = None


def warp(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, typical_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p, then typical-p, in the order and with the tie rules of transformers'
    warpers."""
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
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    if typical_p < 1.0:
        logits = _typical(logits, typical_p)
    return logits


def _typical(logits: torch.Tensor, mass: float) -> torch.Tensor:
    """Keeps the tokens whose surprise is closest to the distribution's entropy, up to `mass` probability."""
    log_probs = torch.log_softmax(logits, -1)
    entropy = -(log_probs * log_probs.exp()).nansum()
    distance, order = torch.sort((-log_probs - entropy).abs())
    cumulative = logits[order].softmax(-1).cumsum(-1)
    last = min(int((cumulative < mass).sum()), len(logits) - 1)
    remove = distance > distance[last]
    return logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))


WATERMARK_KEY = 15485863  # transformers' default hashing key
WATERMARK_GREEN_FRACTION = 0.25
WATERMARK_BIAS = 2.0


def watermark(logits: torch.Tensor, previous_token: int) -> torch.Tensor:
    """Kirchenbauer et al.'s watermark as transformers' WatermarkLogitsProcessor (left hash, context 1): the
    previous token seeds a "green list" of a quarter of the vocabulary, whose logits get +2.0, so that a
    detector that knows the key finds far more green tokens than chance in the text."""
    rng = torch.Generator().manual_seed((WATERMARK_KEY * previous_token) % (2**64 - 1))
    green = torch.randperm(len(logits), generator=rng)[: int(len(logits) * WATERMARK_GREEN_FRACTION)]
    logits = logits.clone()
    logits[green] += WATERMARK_BIAS
    return logits


def row_argmax(logits: torch.Tensor) -> list[int]:
    """Each row's argmax, as torch.argmax picks it (the first of equal maxima; a NaN above all). On CPU numpy's is
    the same pick without torch's dispatch, which made it a step's longest Python-side operation after the forward."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()


def sample_one(raw: torch.Tensor, seq: Sequence, argmax: int | None = None, draft: int | None = None) -> Sampled:
    """The next token of `seq` from its unprocessed logits `raw`.

    With `draft`, the guess at this position is verified first: greedily it is kept when it is the argmax; when
    sampling, by the speculative-sampling rule, kept with probability min(1, p(draft) / q(draft)), where q is
    the drafter's distribution (its logits, else all mass on the draft), and on rejection the token is drawn
    from the normalized max(0, p - q). Either way the result follows the target distribution p.
    """
    p = seq.params
    row = process(raw, seq)
    if seq.grammar is not None:
        row = _constrained(row, seq)
    forced = None if seq.thinking is None else seq.thinking.forced()
    if forced is not None:  # the thinking's budget is spent: its closing tag comes next
        row = torch.full_like(row, float("-inf"))
        row[forced] = 0.0
    if p.greedy:
        if p.watermark:
            row = watermark(row, seq.token_ids[-1])
        token = argmax if row is raw and argmax is not None else int(row.argmax())
    else:
        row = warp(row, p.temperature, p.top_k, p.top_p, p.typical_p, p.min_p)
        if p.watermark:
            row = watermark(row, seq.token_ids[-1])
        probs = row.softmax(-1)
        if not math.isfinite(float(probs.sum())):  # rare, so the repair stays off the hot path
            probs = _finite(row).softmax(-1)
        token = _speculative(probs, seq, draft) if draft is not None else _draw(probs, seq)
    result = Sampled(token)
    if p.return_log_probs or p.top_log_probs:
        logprobs = torch.log_softmax(raw, -1)
        if p.return_log_probs:
            result.logprob = float(logprobs[token])
        if p.top_log_probs:
            top = torch.topk(logprobs, p.top_log_probs)
            result.top_ids, result.top_logprobs = top.indices.tolist(), top.values.tolist()
    return result


def _constrained(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """The grammar's mask, on the answer only: inside a thinking block the model is free, and before it the
    block's opening tag stays allowed beside what the grammar allows."""
    thinking = seq.thinking
    if thinking is None or thinking.answering:
        return seq.grammar.mask(row)
    opening = thinking.opening_token()
    if opening is None:
        return row
    if thinking.opened:  # the opening tag begun: only its next token
        masked = torch.full_like(row, float("-inf"))
    else:
        masked = seq.grammar.mask(row)
    masked[opening] = row[opening]
    return masked


def _finite(logits: torch.Tensor) -> torch.Tensor:
    """Logits that softmax takes whatever the parameters: a temperature or penalty that overflows float32 gives
    NaN where a masked -inf met an infinite divisor (still masked: -inf), or +inf where a tiny temperature blew a
    logit up (the limit is greedy: the mass goes to those tokens alone)."""
    overflowed = logits == float("inf")
    if bool(overflowed.any()):
        return torch.zeros_like(logits).masked_fill(~overflowed, float("-inf"))
    return logits.nan_to_num(nan=float("-inf"))


def _draw(probs: torch.Tensor, seq: Sequence) -> int:
    return int(torch.multinomial(probs, 1, generator=seq.random_stream(probs.device)))


def _speculative(probs: torch.Tensor, seq: Sequence, draft: int) -> int:
    if seq.speculation.draft_logits is not None:
        q = seq.speculation.draft_logits[seq.speculation.accepted_drafts].softmax(-1)
    else:
        q = torch.zeros_like(probs)
        q[draft] = 1.0
    accept = min(1.0, float(probs[draft]) / max(float(q[draft]), 1e-20))
    if float(torch.rand(1, generator=seq.random_stream(probs.device), device=probs.device)) < accept:
        return draft
    residual = (probs - q).clamp(min=0)
    return _draw(residual / residual.sum() if residual.sum() > 0 else probs, seq)
