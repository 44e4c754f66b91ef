"""The greedy screen (engine/decoding/greedy_screen.py) against the whole float32 output layer: the bfloat16 kernel sums
as float32 does, the screen's argmax is the layer's even where tokens are closer than its copies (bfloat16, and
8-bit blocks for one row) can tell apart, the candidates keep their float32 logits, and the engine screens only
the steps that need nothing but the argmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tritonllm.engine.decoding import greedy_screen
from tritonllm.engine.decoding.greedy_screen import GreedyScreen
from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence


@pytest.fixture(scope="module")
def kernels():
    built = cpu_kernels.native()
    assert built is not None, "the native kernels did not build: the engine would run on its slow fallback"
    return built


def input_ways(kernels) -> list[tuple[torch.dtype, bool]]:
    """(input dtype, through AMX's tiles): float32 inputs always; bfloat16 ones through vdpbf16ps where the CPU
    multiplies bfloat16 pairs, and through AMX's tiles too where they serve (for a K that is a multiple of 32)."""
    ways = [(torch.float32, False)]
    if kernels.bfloat16_dot:
        ways.append((torch.bfloat16, False))
    if kernels.bfloat16_tiles:
        ways.append((torch.bfloat16, True))
    return ways


def products(kernels, x: torch.Tensor, low: torch.Tensor, tiles: bool = True) -> torch.Tensor:
    """x @ low^T by the screen's kernel for x's type: low as it lies for float32, packed in pairs for bfloat16
    (through AMX's tiles where `tiles` and they serve)."""
    if x.dtype == torch.bfloat16:
        return kernels.bfloat16_pair_linear(x, kernels.pack_bfloat16_pairs(low), len(low), tiles)
    return kernels.bfloat16_linear(x, low)


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 32])
@pytest.mark.parametrize("out_features, in_features", [(2003, 576), (96, 64), (37, 100), (5, 7)])
def test_the_bfloat16_kernel_sums_the_widened_values_in_float32(kernels, rows, out_features, in_features):
    generator = torch.Generator().manual_seed(rows + out_features)
    x = torch.randn(rows, in_features, generator=generator)
    low = torch.randn(out_features, in_features, generator=generator).bfloat16()
    for dtype, tiles in input_ways(kernels):
        given = x.to(dtype)
        expected = F.linear(given.float(), low.float())
        torch.testing.assert_close(products(kernels, given, low, tiles), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("in_features", [576, 100, 7])
def test_a_rows_result_is_the_same_bits_whatever_else_is_in_the_step(kernels, in_features):
    """One row alone takes the many-stream path, several rows the tiles of every size (AMX's: blocks of 16 rows,
    the last one padded): each output is summed the same way in all of them, so a sequence's candidates do not
    depend on its step."""
    generator = torch.Generator().manual_seed(in_features)
    x = torch.randn(37, in_features, generator=generator)
    low = torch.randn(203, in_features, generator=generator).bfloat16()
    for dtype, tiles in input_ways(kernels):
        given = x.to(dtype)
        together = products(kernels, given, low, tiles)
        for rows in range(1, len(x) + 1):
            assert torch.equal(products(kernels, given[:rows].contiguous(), low, tiles), together[:rows])
        alone = torch.cat([products(kernels, given[r : r + 1].contiguous(), low, tiles) for r in range(len(x))])
        assert torch.equal(alone, together)


def near_ties(vocab: int = 4096, width: int = 576, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer and inputs whose two best tokens are closer than bfloat16's rounding of the weight moves them:
    for each input, token 2i + 1 is token 2i's row plus a random change that the input does not see (orthogonal
    to it) and a nudge along it worth 1e-3 of a logit, up or down (more than float32 sums of 576 products differ by,
    less than bfloat16 moves). The two rows round to different bfloat16 values,
    whose logits differ by some 1e-2 either way, so which of the two wins is decided only by float32 weights."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, width, generator=generator) * 0.05
    hidden = torch.randn(16, width, generator=generator) * 3
    for i, x in enumerate(hidden):
        best, unit = 2 * i, x / x.norm()
        weight[best] = unit * 0.6  # well ahead of the random rows
        unseen = torch.randn(width, generator=generator) * 0.05
        unseen -= (unseen @ unit) * unit
        weight[best + 1] = weight[best] + unseen + (1 if i % 2 else -1) * 1e-3 * unit / x.norm()
    return weight, hidden


def eight_bit_blocks(weight: torch.Tensor) -> torch.Tensor:
    """The values of the screen's copy in 8-bit blocks of 32 (a scale per block: its largest magnitude over 127)."""
    blocks = weight.reshape(len(weight), -1, 32)
    scales = blocks.abs().amax(dim=2, keepdim=True) / 127
    return ((blocks / scales).round() * scales).reshape(weight.shape)


@pytest.mark.parametrize("copy", ["bfloat16", "8-bit blocks"])
def test_the_screens_argmax_is_the_float32_layers_where_its_copy_cannot_tell_the_tokens_apart(kernels, copy):
    """The 8-bit copy serves steps of up to `block_rows` rows, the bfloat16 one (where there is one) larger steps."""
    weight, hidden = near_ties()
    screen = GreedyScreen(weight)
    if copy == "bfloat16" and screen.low is None:
        pytest.skip("this CPU does not multiply bfloat16 pairs: the 8-bit copy serves every screened step")
    full = F.linear(hidden, weight)
    low = F.linear(hidden, weight.bfloat16().float() if copy == "bfloat16" else eight_bit_blocks(weight))
    assert (low.argmax(1) != full.argmax(1)).any(), "the case must be one where the copy's own argmax is wrong"
    step = greedy_screen.max_rows() if copy == "bfloat16" else screen.block_rows
    for start in range(0, len(hidden), step):
        rows = hidden[start : start + step]
        screened = screen.logits(rows)
        assert screened.argmax(1).tolist() == full[start : start + len(rows)].argmax(1).tolist()


@pytest.mark.parametrize("rows", [1, 4])
def test_the_candidates_keep_their_float32_logits_and_every_other_token_is_minus_infinity(kernels, rows):
    weight, hidden = near_ties(seed=1)
    screened = GreedyScreen(weight).logits(hidden[:rows])
    full = F.linear(hidden[:rows], weight)
    kept = torch.isfinite(screened)
    assert kept.sum(1).ge(2).all() and kept.sum(1).le(64).all()  # both of the tied tokens, and few others
    torch.testing.assert_close(screened[kept], full[kept], rtol=1e-6, atol=1e-5)
    assert (screened[~kept] == float("-inf")).all()
    # no token left out could have won: each lies below the best by more than the two layers can differ
    assert (full[~kept] < full.max(1, keepdim=True).values.expand_as(full)[~kept]).all()


def test_the_input_rounding_is_bounded_too(kernels):
    """Where the input is rounded to bfloat16, two tokens whose weights bfloat16 holds exactly (no weight rounding
    to bound) can still trade places: token 1 is token 0 plus a change nearly orthogonal to the input but along
    the input's rounding, so the rounded input favours it by far more than the float32 logits separate the two.
    The screen keeps the float32 winner (fails with the input's rounding left out of the bound)."""
    if not kernels.bfloat16_dot:
        pytest.skip("this CPU has no bfloat16 pair products: the screen does not round the input")
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(8, 576, generator=generator) * 3
    weight = torch.randn(1024, 576, generator=generator) * 0.05
    for i, x in enumerate(hidden):
        unit, error = x / x.norm(), x.bfloat16().float() - x
        along = error - (error @ unit) * unit
        weight[2 * i] = (unit * 0.6).bfloat16().float()
        change = (along / along.norm() * (1 if i % 2 else -1)).bfloat16().float()
        weight[2 * i + 1] = (weight[2 * i] + change).bfloat16().float()
    full = kernels.dense_linear(hidden, weight, torch.empty(0))
    rounded = products(kernels, hidden.bfloat16(), weight.bfloat16())
    assert (rounded.argmax(1) != full.argmax(1)).any(), "the rounded input must pick the wrong token somewhere"
    assert torch.equal(GreedyScreen(weight).logits(hidden).argmax(1), full.argmax(1))


@pytest.mark.parametrize("rows", [1, 5, 32, 64])
def test_the_candidates_logits_are_the_unscreened_layers_bits(kernels, rows):
    """The candidates are summed as kernels/dense_linear.cpp sums the unscreened output layer, so the screened step
    picks exactly the token the whole layer picks, ties included."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(3000, 576, generator=generator) * 0.05
    hidden = torch.randn(rows, 576, generator=generator) * 3
    weight[:rows] = hidden / hidden.norm(dim=1, keepdim=True) * 0.3  # a clear winner for each row ...
    weight[rows : 2 * rows] = weight[:rows]  # ... tied with a copy of itself: the first of the two wins
    screened = GreedyScreen(weight).logits(hidden) if rows <= greedy_screen.max_rows() else None
    if screened is None:
        pytest.skip(f"{rows} rows are not screened on this CPU")
    full = kernels.dense_linear(hidden, weight, torch.empty(0))
    kept = torch.isfinite(screened)
    assert torch.equal(screened[kept], full[kept])
    assert torch.equal(screened.argmax(1), full.argmax(1))
    assert screened.argmax(1).tolist() == list(range(rows))


@pytest.mark.parametrize(
    "params, screens",
    [
        (SamplingParams(), True),
        (SamplingParams(top_k=1, temperature=0.7), True),
        (SamplingParams(temperature=0.7), False),
        (SamplingParams(return_log_probs=True), False),
        (SamplingParams(top_log_probs=2), False),
        (SamplingParams(return_generation_logits=True), False),
        (SamplingParams(return_context_logits=True), False),
        (SamplingParams(repetition_penalty=1.2), False),
        (SamplingParams(min_tokens=3, end_id=2), False),
        (SamplingParams(watermark=True), False),
    ],
)
def test_only_steps_that_need_nothing_but_the_argmax_are_screened(params, screens):
    assert greedy_screen.screenable(Sequence([1, 2, 3], params)) is screens


def generate(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[Sequence]:
    seqs = [Sequence(list(p), params) for p in prompts]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    return seqs


def test_the_engine_screens_greedy_steps_and_answers_as_without_the_screen(tiny_model_dir, hf_model, monkeypatch):
    """Greedy steps of one and of several sequences go through the screen, and every token equals transformers'
    generate(); a request for log-probs is not screened, its log-probs those of the whole layer."""
    screened = []
    original = GreedyScreen.logits
    monkeypatch.setattr(
        GreedyScreen, "logits", lambda self, hidden: screened.append(len(hidden)) or original(self, hidden)
    )
    engines = {
        on: LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=128, greedy_screen=on)) for on in (True, False)
    }
    prompts = [[5, 17, 42, 99, 3], [7, 7, 8], [120, 4, 66, 12, 9, 31, 2]]
    for alone in prompts[:1], prompts:
        got = generate(engines[True], alone, SamplingParams(max_tokens=12))
        expected = hf_model.generate(torch.tensor([alone[0]]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
        assert got[0].token_ids == expected[0].tolist()
        assert [s.token_ids for s in got] == [
            s.token_ids for s in generate(engines[False], alone, SamplingParams(max_tokens=12))
        ]
    assert 1 in screened and len(prompts) in screened, "greedy steps of one and of several rows must be screened"
    if cpu_kernels.native().bfloat16_dot:  # steps of up to 64 rows are screened there
        many = [[(7 * i + j) % 200 + 1 for j in range(3 + i % 4)] for i in range(12)]
        screened.clear()
        got = generate(engines[True], many, SamplingParams(max_tokens=8))
        assert [s.token_ids for s in got] == [
            s.token_ids for s in generate(engines[False], many, SamplingParams(max_tokens=8))
        ]
        assert 12 in screened, "a step of 12 greedy rows must be screened where the input is rounded to bfloat16"
    screened.clear()
    with_log_probs = SamplingParams(max_tokens=6, return_log_probs=True)
    got, plain = (generate(engines[on], prompts[:1], with_log_probs)[0] for on in (True, False))
    assert not screened
    assert got.token_ids == plain.token_ids and got.recorded.logprobs == plain.recorded.logprobs


def test_a_packed_copy_of_another_shape_is_refused_by_name(kernels):
    if not kernels.bfloat16_dot:
        pytest.skip("this CPU has no bfloat16 pair products")
    low = torch.randn(100, 64).bfloat16()
    packed = kernels.pack_bfloat16_pairs(low)
    x = torch.randn(3, 64).bfloat16()
    for n, width in [(200, 64), (100, 66), (100, 60)]:
        with pytest.raises(RuntimeError, match="packed"):
            kernels.bfloat16_pair_linear(torch.randn(3, width).bfloat16(), packed, n)
    with pytest.raises(RuntimeError, match="packed"):
        weight = low.float()
        norms = weight.norm(dim=1)
        kernels.greedy_screen_logits(x.float(), low, weight, norms, norms, True, 1.01, 0.0)
