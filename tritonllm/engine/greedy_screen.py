"""A greedy step's argmax without the whole float32 output layer.

SmolLM2's output layer (49152 x 576, tied to the embedding) is a fifth of the float32 bytes one sequence's decode
step reads, and at 32 sequences a sixth of the step's arithmetic. A greedy step needs only the argmax of the
logits, so the screen multiplies by a bfloat16 copy of that layer (kernels/bfloat16_linear.cpp): half the bytes,
summed in float32; where the CPU multiplies bfloat16 pairs (AVX512_BF16), with the input rounded to bfloat16 too,
twice the products an instruction. For every token it bounds how far its float32 logit can be from that product:

    |fl(w.x) - fl(w'.x')| <= ||w - w'|| ||x|| + ||w'|| ||x - x'|| + gamma (||w|| + ||w'||) (||x|| + ||x - x'||)

(the weight's and the input's rounding, by Cauchy-Schwarz, plus float32 summation in any order of K products,
gamma = K u / (1 - K u), u = 2^-24; x' is x in bfloat16, or x itself where it is not rounded), plus what
vdpbf16ps flushes to zero. A token whose product plus its bound is below the largest product minus that token's
bound cannot be the float32 argmax; the others (the candidates, a handful when the model is sure) get their
float32 logits, summed as the unscreened layer (kernels/dense_linear.cpp) sums them, bit for bit
(kernels/greedy_screen.cpp). What a step returns is those logits, every other token -inf: its argmax is the one
the whole layer gives.

Only for rows that need nothing but the argmax: greedy, no log-probs, no logits returned, nothing that edits the
logits (penalties, biases, grammars, a thinking budget, watermarks), no beams (`screenable`).
"""

from __future__ import annotations

import torch

from . import cpu_kernels
from .native_linear import NATIVE_ROWS
from .sequence import Sequence

_UNIT_ROUNDOFF = 2.0**-24
_SAFETY = 1.01  # the norms and the bound are themselves float32 arithmetic
_SMALLEST_NORMAL = 2.0**-126  # vdpbf16ps reads smaller inputs as zero and flushes smaller sums to zero


def max_rows() -> int:
    """The most rows a screened step takes. Where the input is rounded to bfloat16 too, up to the rows the native
    dense kernel takes (the candidates' logits are its bits; past it the BLAS sums otherwise); otherwise 8:
    widening each weight costs as much arithmetic as float32, which at more rows than that sets the pace."""
    return NATIVE_ROWS if cpu_kernels.native().bfloat16_dot else 8


class GreedyScreen:
    """An output layer's bfloat16 copy and per-token bounds (57 MB on SmolLM2); `weight` stays the float32 one."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.detach()
        low = self.weight.bfloat16()
        self.low = torch.where(low.abs() < _SMALLEST_NORMAL, 0, low)  # as vdpbf16ps reads it
        self.rounds_input = bool(cpu_kernels.native().bfloat16_dot)
        k = self.weight.shape[1]
        gamma = k * _UNIT_ROUNDOFF / (1 - k * _UNIT_ROUNDOFF)
        rounding = (self.weight - self.low.float()).norm(dim=1)
        norms = self.weight.norm(dim=1)
        self.low_norms = _SAFETY * self.low.float().norm(dim=1)
        self.slack = _SAFETY * (rounding + gamma * (2 * norms + rounding))  # times ||x|| + ||x - x'||
        self.flush = 2 * (k + 64) * _SMALLEST_NORMAL  # each flushed sum is off by less than the smallest normal

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, K] float32, R <= max_rows(). [R, vocab] float32: each row's candidates with their float32
        logits, every other token -inf."""
        return cpu_kernels.native().greedy_screen_logits(
            hidden.contiguous(),
            self.low,
            self.weight,
            self.slack,
            self.low_norms,
            self.rounds_input,
            _SAFETY,
            self.flush,
        )

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
