"""A GGUF model's linear layers with their weights kept in the file's block-quantized formats.

llama.cpp users serve Q8_0 and Q4 files because a decode step streams every weight from memory: 8 bits are a
quarter of float32's bytes and 4 bits an eighth. The engine loads such a model as transformers dequantizes it
(formats/gguf.py), then swaps each nn.Linear whose GGUF tensor is Q8_0, Q4_0, Q4_1, Q5_0, Q4_K or Q6_K for a
QuantizedLinear holding that tensor's blocks (Q5_0 and Q6_K widened to 8 bits, Q6_K with a scale per 16 values,
Q4_K recut into 32-value blocks of 4 bits), and frees the float32 copy; the input embedding, when the file keeps
it in blocks (or ties it to a block-quantized output layer), becomes a QuantizedEmbedding that reads the same
blocks.
The swap and its checks are gguf_swap.py's; the blocks' formats are formats/gguf_blocks.py's.

Up to GEMM_ROWS - 1 rows (decode steps, and prompt chunks up to 64 tokens) run the native kernel over the
blocks; more rows go to the float32 GEMM for prompts (kernels/panel_gemm.cpp), which widens each panel of weight
rows as it takes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from tritonllm.engine.kernels import cpu_kernels
from tritonllm.formats.gguf_blocks import BLOCK, BlockQuantized

# From this many rows up, past the rows of a decode step, the prompt GEMM over panels beats the block kernel on
# every CPU measured (AVX-512 and AVX2 builds; bench/results/log.md); below it the block kernel runs.
GEMM_ROWS = 65
_NO_BIAS = torch.empty(0)


class QuantizedLinear(torch.nn.Module):
    """`int8_activations`: decode-sized inputs are rounded to 8 bits per block and multiplied with integer dot
    products (kernels/quantized_linear_int8.cpp), as llama.cpp does; faster, not exact. Weights with a scale per 16
    values (Q6_K) keep float32 inputs: that kernel reads one weight scale per 32 values."""

    def __init__(self, weight: BlockQuantized, bias: torch.Tensor | None, int8_activations: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bits = weight.bits
        self.int8_activations = int8_activations and weight.scales.shape[1] * BLOCK == self.in_features
        self.register_buffer("qweight", weight.qweight)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("mins", weight.mins)
        self.register_buffer("bias", None if bias is None else bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = cpu_kernels.native()
        flat = x.reshape(-1, self.in_features).contiguous()
        if flat.shape[0] >= GEMM_ROWS:
            bias = _NO_BIAS if self.bias is None else self.bias
            out = kernels.quantized_panel_linear(flat, self.qweight, self.scales, self.mins, self.bits, bias)
            return out.view(*x.shape[:-1], self.out_features)
        multiply = kernels.quantized_linear_int8 if self.int8_activations else kernels.quantized_linear
        out = multiply(flat, self.qweight, self.scales, self.mins, self.bits)
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)


def side_by_side(layers: list[QuantizedLinear]) -> QuantizedLinear | None:
    """One layer whose output rows are the given layers' in order (a block's q/k/v or gate/up), so that a step
    makes one call and one pass over the input for them; None when they differ in format, input or bias. Each
    output row is computed as its own layer computes it. The layers keep working: their buffers become views of
    the joined rows, so the weights are held once."""
    first = layers[0]
    kinds = {
        (q.bits, q.in_features, q.scales.shape[1], q.int8_activations, q.bias is None, q.mins.numel() == 0)
        for q in layers
    }
    if len(kinds) != 1:
        return None
    weight = BlockQuantized(
        torch.cat([q.qweight for q in layers]),
        torch.cat([q.scales for q in layers]),
        torch.cat([q.mins for q in layers]) if first.mins.numel() else first.mins,
        first.bits,
    )
    bias = None if first.bias is None else torch.cat([q.bias for q in layers])
    joined = QuantizedLinear(weight, bias, first.int8_activations)
    start = 0
    for q in layers:
        rows = slice(start, start + q.out_features)
        q.qweight, q.scales = joined.qweight[rows], joined.scales[rows]
        if q.mins.numel():
            q.mins = joined.mins[rows]
        if q.bias is not None:
            q.bias = joined.bias[rows]
        start = rows.stop
    return joined


@contextmanager
def float_inputs(model: torch.nn.Module) -> Iterator[None]:
    """The model's block layers multiply float32 inputs for the duration, whatever `int8_activations` says. The model
    check runs so: with 8-bit inputs, two correct paths (the native stack and the modules) differ by their rounding,
    since a last-bit difference upstream flips a value's rounding and the flip grows through the layers (0.3-3.3 of
    SmolLM2's logits apart, where float32 keeps them 4e-5 apart), so only float32 inputs hold a path to exactness.
    The 8-bit kernel is checked on its own, layer by layer (kernel_matches)."""
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear) and m.int8_activations]
    for layer in layers:
        layer.int8_activations = False
    try:
        yield
    finally:
        for layer in layers:
            layer.int8_activations = True


class QuantizedEmbedding(torch.nn.Module):
    """An input embedding kept in its GGUF blocks (shared with a tied output layer's): a step dequantizes only
    the rows of its tokens, exactly as the whole table would dequantize."""

    def __init__(self, weight: BlockQuantized) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.bits = weight.bits
        self.register_buffer("qweight", weight.qweight)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("mins", weight.mins)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        table = BlockQuantized(self.qweight, self.scales, self.mins, self.bits)
        return table.rows(ids.reshape(-1)).dequantize().view(*ids.shape, self.embedding_dim)


# The kernel's output on a probe against torch's matmul on the float32 weight, as a fraction of the largest
# output: float32 sums differ in order only; 8-bit inputs round each value by up to 1/254 of its block's largest.
KERNEL_TOLERANCE = 1e-4
INT8_KERNEL_TOLERANCE = 3e-2
PROBE_ROWS = (1, 3, 8)  # the few-row and the block paths of the kernel (GEMM_ROWS and up is the prompt GEMM)


@torch.inference_mode()
def kernel_matches(layer: QuantizedLinear, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the kernel that will run computes the layer within tolerance of its float32 weight: the load
    holds the arithmetic that serves, not only the blocks' dequantization, to the weight it replaces."""
    generator = torch.Generator().manual_seed(0)
    tolerance = INT8_KERNEL_TOLERANCE if layer.int8_activations else KERNEL_TOLERANCE
    for rows in PROBE_ROWS:
        x = torch.randn(rows, layer.in_features, generator=generator)
        exact = F.linear(x, weight, bias)
        if not (layer(x) - exact).abs().max().item() <= tolerance * exact.abs().max().item():
            return False  # quantize_from_gguf's warning names the layer
    return True
