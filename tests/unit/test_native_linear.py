"""The native float32 linear kernels (decode rows, prompt chunks) against torch's F.linear: every tile shape they
pick (one row, a few, past a multiple of three, row blocks), inputs whose width is no multiple of the vector width,
output widths that end mid-tile or mid-panel, a bias; and the layers the engine swaps in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers import native_linear


@pytest.fixture(scope="module")
def kernels():
    built = cpu_kernels.native()
    assert built is not None, "the native kernels did not build: the engine would run on its slow fallback"
    return built


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6, 7, 13, 32, native_linear.NATIVE_ROWS])
# (2003, 64): threads take a series of shrinking chunks of weight rows, then a tail
@pytest.mark.parametrize("out_features, in_features", [(96, 64), (37, 576), (200, 19), (5, 1536), (2003, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_kernel_equals_f_linear(kernels, rows, out_features, in_features, with_bias):
    x, weight, bias, expected = random_layer(rows, out_features, in_features, with_bias)
    torch.testing.assert_close(kernels.dense_linear(x, weight, bias), expected, rtol=1e-5, atol=1e-4)


def random_layer(rows: int, out_features: int, in_features: int, with_bias: bool):
    """An input, a weight and a bias (empty for none), and what F.linear makes of them in float64."""
    generator = torch.Generator().manual_seed(rows * 1000 + out_features)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else torch.empty(0)
    expected = F.linear(x.double(), weight.double(), bias.double() if with_bias else None).float()
    return x, weight, bias, expected


@pytest.mark.parametrize("in_features", [576, 1536, 19])
def test_a_rows_output_is_the_same_bits_whatever_else_is_in_the_batch(kernels, in_features):
    """Each output is summed the same way in every tile (one row alone, a full tile, the last short one), so a
    sequence's logits, and its greedy and seeded tokens, do not depend on the batch it runs in."""
    generator = torch.Generator().manual_seed(in_features)
    x = torch.randn(native_linear.NATIVE_ROWS, in_features, generator=generator)
    weight = torch.randn(203, in_features, generator=generator)
    together = kernels.dense_linear(x, weight, torch.empty(0))
    for rows in (1, 2, 5, 6, 7, 13, 32):
        assert torch.equal(kernels.dense_linear(x[:rows].contiguous(), weight, torch.empty(0)), together[:rows]), rows


# rows: one tile, tiles with a short last one, a block over several panels, more blocks than one (over 512 rows,
# and 256 or more over few panels); out_features: one panel, several ending mid-panel (48 columns a panel with
# AVX-512, 16 with AVX2), fewer than a vector; in_features: whole 8 x 8 blocks of the panel copy, and a rest.
@pytest.mark.parametrize("rows", [1, 7, 65, 300, 1100])
@pytest.mark.parametrize("out_features, in_features", [(48, 64), (100, 576), (5, 19), (37, 1536), (50, 0)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_prompt_gemm_equals_f_linear(kernels, rows, out_features, in_features, with_bias):
    x, weight, bias, expected = random_layer(rows, out_features, in_features, with_bias)
    torch.testing.assert_close(kernels.panel_linear(x, weight, bias), expected, rtol=1e-5, atol=1e-4)


def test_the_prompt_gemm_gives_a_row_the_same_bits_whatever_else_is_in_the_batch(kernels):
    """Each output summed the same way, whatever the row block, tile or thread: a prompt's hidden states do not
    depend on the prompts chunked beside it."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(1100, 576, generator=generator)
    weight = torch.randn(203, 576, generator=generator)
    together = kernels.panel_linear(x, weight, torch.empty(0))
    for first, rows in ((0, 1), (0, 9), (5, 70), (600, 300), (1, 1099)):
        part = kernels.panel_linear(x[first : first + rows].contiguous(), weight, torch.empty(0))
        assert torch.equal(part, together[first : first + rows]), (first, rows)


def test_bad_shapes_are_refused_by_name(kernels):
    with pytest.raises(RuntimeError, match="differ in K"):
        kernels.dense_linear(torch.randn(2, 8), torch.randn(4, 9), torch.empty(0))
    with pytest.raises(RuntimeError, match="bias"):
        kernels.dense_linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(3))
    with pytest.raises(RuntimeError, match="differ in K"):
        kernels.panel_linear(torch.randn(2, 8), torch.randn(4, 9), torch.empty(0))
    with pytest.raises(RuntimeError, match="bias"):
        kernels.panel_linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(3))


def test_installed_layers_keep_their_weights_and_ties(kernels):
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 24), torch.nn.Linear(24, 50))
    model[2].weight = torch.nn.Parameter(torch.randn(50, 24))
    tied = model[0].weight
    head = torch.nn.Linear(16, 50, bias=False)
    head.weight = tied
    model.append(head)
    x = torch.randn(3, 16)
    expected = [model[1](x), head(x)]
    assert native_linear.install(model) == 3
    assert all(type(m) is native_linear.NativeLinear for m in list(model)[1:])
    assert head.weight is tied
    torch.testing.assert_close([model[1](x), head(x)], expected, rtol=1e-5, atol=1e-5)
    many = torch.randn(native_linear.NATIVE_ROWS + 1, 16)  # past the decode kernel's rows: the prompt GEMM
    torch.testing.assert_close(model[1](many), F.linear(many, model[1].weight, model[1].bias))
    assert torch.equal(model[1](many), kernels.panel_linear(many, model[1].weight, model[1].bias))
