"""The kernels over a GGUF file's own blocks (engine/kernels/gguf_linear.cpp), type by type, against gguf-py: each
value widens to exactly gguf-py's float32, and a layer's product equals the dequantized weight's up to the order of
summation, for decode-sized inputs, the row tiles and the prompt GEMM. `make test-avx2` runs them on the AVX2 build."""

from __future__ import annotations

import gguf as gguf_py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers.gguf_linear import GGUFEmbedding, GGUFLinear, kernel_types
from tritonllm.engine.layers.quantized_linear import GEMM_ROWS

T = gguf_py.GGMLQuantizationType
# each block type's float16 fields (d, dmin, m) by byte offset in the block
HALVES = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,), T.IQ4_NL: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_XS: (0,),
}  # fmt: skip
FLOATS = (T.F32, T.F16, T.BF16)
TYPES = (*HALVES, *FLOATS)
# scales at the edges: zero, negative, the smallest subnormal half, the largest half
EDGE_HALVES = np.array([0.0, -0.0, -1.5, 6e-8, 65504.0, -65504.0, 2.0**-14], dtype=np.float16)


def random_rows(kind: T, n: int, k: int, seed: int = 0) -> np.ndarray:
    """[n, bytes per row] of the type: random bits, the float16 fields sane (random and the edge values above)."""
    rng = np.random.default_rng(seed)
    if kind in FLOATS:
        values = rng.standard_normal((n, k)).astype(np.float32)
        if kind == T.F16:
            return values.astype(np.float16).view(np.uint8)
        if kind == T.BF16:
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    block, size = gguf_py.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    for at in HALVES[kind]:
        halves = (rng.standard_normal((n, k // block)) * 0.01).astype(np.float16)
        halves.flat[: len(EDGE_HALVES)] = EDGE_HALVES
        blocks[:, :, at : at + 2] = halves[..., None].view(np.uint8)
    return blocks.reshape(n, -1)


def gguf_py_values(kind: T, rows: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(gguf_py.quants.dequantize(rows, kind), dtype=np.float32))


def test_every_common_type_has_a_kernel():
    assert {t.value for t in TYPES} <= kernel_types()
    assert T.IQ2_XXS.value not in kernel_types()  # a type without one is named by the load's refusal


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
def test_each_type_widens_to_gguf_pys_values_bit_for_bit(kind):
    rows = random_rows(kind, 24, 512)
    ours = cpu_kernels.native().gguf_dequantize(torch.from_numpy(rows), kind.value, 512)
    expected = gguf_py_values(kind, rows)
    assert torch.isfinite(expected).all()
    # equal as numbers (a zero scale's -0.0 may come out +0.0: no product or sum tells them apart)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 20, GEMM_ROWS - 1, GEMM_ROWS, 80])
@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
def test_the_product_equals_the_dequantized_weights_up_to_summation_order(kind, rows):
    out_features, in_features = 37, 768  # an odd row count: the kernel's column groups leave a remainder
    raw = torch.from_numpy(random_rows(kind, out_features, in_features, seed=rows))
    bias = torch.randn(out_features)
    layer = GGUFLinear(raw, kind.value, in_features, bias)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    weight = gguf_py_values(kind, raw.numpy())
    exact = F.linear(x.double(), weight.double(), bias.double())
    # float32 sums in any order: within a few units of the last place of the sum of |products|
    bound = (x.abs().double() @ weight.abs().double().T + bias.abs().double()) * 2e-6
    assert ((layer(x).double() - exact).abs() <= bound).all()


def test_rows_of_a_strided_view_and_the_embedding_read_the_same_values():
    raw = torch.from_numpy(random_rows(T.Q4_K, 50, 256))
    embedding = GGUFEmbedding(raw, T.Q4_K.value, 256)
    ids = torch.tensor([[3, 49, 0], [3, 7, 7]])
    table = gguf_py_values(T.Q4_K, raw.numpy())
    assert torch.equal(embedding(ids), table[ids])


def test_a_weight_whose_rows_are_not_whole_blocks_is_refused():
    raw = torch.from_numpy(random_rows(T.Q4_K, 4, 256))
    with pytest.raises(RuntimeError, match="in_features 200 is not a whole number of 256-value blocks"):
        cpu_kernels.native().gguf_linear(torch.randn(1, 200), raw, T.Q4_K.value, torch.empty(0), GEMM_ROWS)
