"""A greedy step's argmax without reading the whole float32 output layer.

One sequence's decode step streams every weight from memory, and SmolLM2's output layer (49152 x 576, tied to the
embedding) is a fifth of its float32 bytes. A greedy step needs only the argmax of the logits, so the screen reads a
bfloat16 copy of that layer (half the bytes; kernels/bfloat16_linear.cpp sums in float32) and bounds, for every
token, how far its float32 logit can be from the bfloat16 one:

    |fl(w.x) - fl(w'.x)| <= ||w - w'|| ||x|| + gamma (||w|| + ||w'||) ||x||,    gamma = K u / (1 - K u)

(the weight's rounding, by Cauchy-Schwarz, plus float32 summation in any order of K products, u = 2^-24). A token
whose bfloat16 logit plus its bound is below the largest bfloat16 logit minus that token's bound cannot be the
float32 argmax; the others (the candidates, a handful when the model is sure) get their float32 logits from the
float32 weight's rows. What a step returns is those logits, every other token -inf: its argmax is the float32
layer's argmax, so greedy output is what the whole layer gives (up to the summation order of the candidates' own
rows, as for any kernel).

Only for rows that need nothing but the argmax: greedy, no log-probs, no logits returned, nothing that edits the
logits (penalties, biases, grammars, a thinking budget, watermarks), no beams (`screenable`).
"""

from __future__ import annotations

import torch

from . import cpu_kernels
from .sequence import Sequence

MAX_ROWS = 8  # decode steps of a few sequences: past that the layer's arithmetic, not its bytes, sets the pace
_UNIT_ROUNDOFF = 2.0**-24
_SAFETY = 1.01  # the norms and the bound are themselves float32 arithmetic


class GreedyScreen:
    """An output layer's bfloat16 copy and per-token bounds (57 MB on SmolLM2); `weight` stays the float32 one."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.detach()
        self.low = self.weight.bfloat16()
        k = self.weight.shape[1]
        gamma = k * _UNIT_ROUNDOFF / (1 - k * _UNIT_ROUNDOFF)
        rounding = (self.weight - self.low.float()).norm(dim=1)
        norms = self.weight.norm(dim=1)
        self.slack = _SAFETY * (rounding + gamma * (2 * norms + rounding))  # times ||x||: each token's bound

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, K] float32, R <= MAX_ROWS. [R, vocab] float32: each row's candidates with their float32
        logits, every other token -inf."""
        hidden = hidden.contiguous()
        approx = cpu_kernels.native().bfloat16_linear(hidden, self.low)
        bound = self.slack * hidden.norm(dim=1, keepdim=True)
        floor = (approx - bound).amax(dim=1, keepdim=True)
        rows, tokens = torch.nonzero(approx + bound >= floor, as_tuple=True)
        out = torch.full_like(approx, float("-inf"))
        out[rows, tokens] = (hidden[rows] * self.weight[tokens]).sum(dim=1)
        return out

    @staticmethod
    def serves(lm_head: torch.nn.Module) -> bool:
        """A float32 output layer without bias, on CPU, with the native kernels built."""
        weight = getattr(lm_head, "weight", None)
        return (
            isinstance(lm_head, torch.nn.Linear)
            and lm_head.bias is None
            and isinstance(weight, torch.Tensor)
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and cpu_kernels.native() is not None
        )


def screenable(seq: Sequence) -> bool:
    """Whether all a step needs of `seq`'s logits is their argmax."""
    p = seq.params
    return (
        p.greedy
        and not p.processes_logits
        and not (p.return_log_probs or p.top_log_probs or p.return_generation_logits)
        and not (p.return_context_logits or p.wants_prompt_logits)
        and not p.watermark
        and seq.grammar is None
        and seq.thinking is None
        and seq.beam is None
    )
