"""A greedy step's argmax without the whole float32 output layer.

SmolLM2's output layer (49152 x 576, tied to the embedding) is a fifth of the float32 bytes one sequence's decode
step reads, and at 32 sequences a sixth of the step's arithmetic. A greedy step needs only the argmax of the
logits, so the screen multiplies by a smaller copy of that layer:
- in 8-bit blocks (Q8_0's layout with float32 scales), by the input in float32 (kernels/quantized_linear.cpp): a
  quarter of float32's bytes, for steps of up to 4 rows (one sequence's decode waits on memory), and for every
  screened step where the CPU does not multiply bfloat16 pairs (there it beat the bfloat16 copy at 1 to 8 rows);
- in bfloat16, where the CPU multiplies bfloat16 pairs (AVX512_BF16), with the input rounded to bfloat16 too:
  vdpbf16ps does twice a float32 FMA's products on AMD Zen 4, which pays at more rows, where arithmetic sets the
  pace (kernels/bfloat16_linear.cpp; with a float32 input it also serves a layer whose width is no multiple of
  32); where AMX's tiles serve (Intel since Sapphire Rapids, kernels/bfloat16_tiles.cpp), they multiply the same
  copy at the memory's speed (an Intel Xeon's vdpbf16ps does no more products than its float32 FMAs).
For every token it bounds how far its float32 logit can be from that product:

    |fl(w.x) - fl(w'.x')| <= ||w - w'|| ||x|| + ||w'|| ||x - x'|| + gamma (||w|| + ||w'||) (||x|| + ||x - x'||)

(the weight's and the input's rounding, by Cauchy-Schwarz, plus float32 summation in any order of K products,
gamma = K u / (1 - K u), u = 2^-24; w' the copy's values, x' the input in bfloat16, or x itself where it is not
rounded), plus what vdpbf16ps and the tiles flush to zero. A token whose product plus its bound is below the
largest product minus that token's bound cannot be the float32 argmax; the others (the candidates, a handful when
the model is sure) get their float32 logits, summed as the unscreened layer (kernels/dense_linear.cpp) sums them,
bit for bit (kernels/greedy_screen.cpp). What a step returns is those logits, every other token -inf: its argmax
is the one the whole layer gives.

Only for rows that need nothing but the argmax: greedy, no log-probs, no logits returned, nothing that edits the
logits (penalties, biases, grammars, a thinking budget, watermarks), no beams (`screenable`).
"""

from __future__ import annotations

import torch

from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers.native_linear import NATIVE_ROWS
from tritonllm.engine.state.sequence import Sequence

_UNIT_ROUNDOFF = 2.0**-24
_SAFETY = 1.01  # the norms and the bound are themselves float32 arithmetic
_SMALLEST_NORMAL = 2.0**-126  # vdpbf16ps reads smaller inputs as zero and flushes smaller sums to zero
BLOCK = 32  # values a scale of the 8-bit copy covers, as GGUF's Q8_0
# Steps of up to this many rows multiply by the 8-bit copy where the bfloat16 one is there for more. AMD EPYC Zen 4,
# SmolLM2's layer in the engine's steps, ms for the 8-bit and bfloat16 copies: 1 row 1.18 / 1.77, 2 rows 1.41 /
# 1.68, 4 rows 1.90 / 2.00, 8 rows 3.63 / 2.59. The same sources built for AVX2 (no bfloat16 pairs): 1.15 / 1.95,
# 1.62 / 1.91, 2.15 / 2.66, 3.92 / 4.67.
BLOCK_ROWS = 4


def max_rows() -> int:
    """The most rows a screened step takes. Where the input is rounded to bfloat16 too, up to the rows the native
    dense kernel takes (the candidates' logits are its bits; past it the prompt GEMM sums otherwise); otherwise 8: the
    8-bit copy's block kernel widens every weight, as much arithmetic as float32, which at more rows sets the
    pace."""
    return NATIVE_ROWS if cpu_kernels.native().bfloat16_dot else 8


class GreedyScreen:
    """An output layer's copies and per-token bounds; `weight` stays the float32 one. SmolLM2: 32 MB in 8-bit
    blocks, and 57 MB in bfloat16 where the CPU multiplies bfloat16 pairs."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.detach()
        kernels = cpu_kernels.native()
        k = self.weight.shape[1]
        gamma = k * _UNIT_ROUNDOFF / (1 - k * _UNIT_ROUNDOFF)
        norms = self.weight.norm(dim=1)

        def slack(copy: torch.Tensor) -> torch.Tensor:
            """Per token, what multiplies ||x|| + ||x - x'|| in the bound, for a copy whose values are `copy`."""
            rounding = (self.weight - copy).norm(dim=1)
            return _SAFETY * (rounding + gamma * (2 * norms + rounding))

        self.blocks = None  # values, scales and slack of the copy in 8-bit blocks
        if k % BLOCK == 0:
            q, scales = _eight_bit_blocks(self.weight)
            self.blocks = q, scales, slack(kernels.dequantize(q, scales, torch.empty(0), 8))
        self.block_rows = 0 if self.blocks is None else BLOCK_ROWS if kernels.bfloat16_dot else max_rows()
        self.low = None  # the bfloat16 copy: [V, K], or packed for vdpbf16ps where the input is rounded too
        if self.block_rows < max_rows():
            low = self.weight.bfloat16()
            low = torch.where(low.abs() < _SMALLEST_NORMAL, 0, low)  # as vdpbf16ps reads it
            self.rounds_input = bool(kernels.bfloat16_dot)
            self.low_norms = _SAFETY * low.float().norm(dim=1)
            self.slack = slack(low.float())
            self.low = kernels.pack_bfloat16_pairs(low) if self.rounds_input else low
            self.flush = 2 * (k + 64) * _SMALLEST_NORMAL  # each flushed sum is off by less than the smallest normal

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, K] float32, R <= max_rows(). [R, vocab] float32: each row's candidates with their float32
        logits, every other token -inf."""
        kernels = cpu_kernels.native()
        if len(hidden) <= self.block_rows:
            q, scales, slack = self.blocks
            return kernels.greedy_screen_logits_q8(hidden.contiguous(), q, scales, self.weight, slack, _SAFETY)
        return kernels.greedy_screen_logits(
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


def _eight_bit_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [V, K] in blocks of 32 values: int8 values [V, K] and float32 scales [V, K / 32] (each block's largest
    magnitude over 127, the values rounded to the nearest), GGUF's Q8_0 layout with float32 scales."""
    blocks = weight.reshape(len(weight), -1, BLOCK)
    scales = blocks.abs().amax(dim=2) / 127
    divided = blocks / torch.where(scales > 0, scales, 1)[..., None]
    return divided.round().clamp(-127, 127).to(torch.int8).reshape(weight.shape), scales


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
