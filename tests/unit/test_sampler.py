"""The sampler's warpers against transformers' logits processors on the same logits."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
    WatermarkLogitsProcessor,
)

from tritonllm.engine.decoding.sampler import row_argmax, warp, watermark


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(0.7, 0, 1.0), (1.0, 20, 1.0), (1.3, 0, 0.8), (0.5, 40, 0.9)]
)
def test_warp_equals_transformers_processors(temperature, top_k, top_p):
    logits = torch.randn(1, 4096, generator=torch.Generator().manual_seed(0)) * 3
    expected = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(warp(logits[0], temperature, top_k, top_p), expected[0])


@pytest.mark.parametrize("typical_p", [0.2, 0.5, 0.95])
def test_typical_p_equals_transformers_warper(typical_p):
    logits = torch.randn(1, 4096, generator=torch.Generator().manual_seed(1)) * 2
    expected = TypicalLogitsWarper(mass=typical_p)(None, TopPLogitsWarper(0.9)(None, logits / 0.8))
    assert torch.equal(warp(logits[0], 0.8, 0, 0.9, typical_p), expected[0])


@pytest.mark.parametrize("min_p", [0.05, 0.3, 1.0])
def test_min_p_equals_transformers_warper(min_p):
    """After top-p and before typical-p, as generate() orders them."""
    logits = torch.randn(1, 4096, generator=torch.Generator().manual_seed(3)) * 3
    expected = TypicalLogitsWarper(mass=0.9)(None, MinPLogitsWarper(min_p)(None, TopPLogitsWarper(0.95)(None, logits)))
    assert torch.equal(warp(logits[0], 1.0, 0, 0.95, 0.9, min_p), expected[0])


def test_watermark_equals_transformers_processor():
    logits = torch.randn(1, 4096, generator=torch.Generator().manual_seed(2))
    previous = torch.tensor([[17, 905]])
    expected = WatermarkLogitsProcessor(4096, "cpu")(previous, logits.clone())
    assert torch.equal(watermark(logits[0], 905), expected[0])


def test_watermarked_greedy_generation_equals_generate(tiny_model_dir, hf_model):
    from transformers import WatermarkingConfig

    from tritonllm.engine.state.sampling_params import SamplingParams
    from tritonllm.engine.state.sequence import Sequence

    from .test_engine import make_engine, run

    prompt = [11, 250, 3000, 42]
    seq = Sequence(prompt, SamplingParams(max_tokens=16, watermark=True))
    run(make_engine(tiny_model_dir), [seq])
    expected = hf_model.generate(
        torch.tensor([prompt]),
        max_new_tokens=16,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
        watermarking_config=WatermarkingConfig(),
    )[0, len(prompt) :].tolist()
    plain = hf_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert seq.output_ids == expected != plain[0, len(prompt) :].tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_row_argmax_picks_as_torch_does_ties_nan_and_infinities_included(dtype):
    logits = torch.randn(7, 300, generator=torch.Generator().manual_seed(0))
    logits[0, [5, 200]] = 100.0  # equal maxima: the first
    logits[1, [7, 3]] = float("nan")  # a NaN is above all: the first NaN
    logits[2] = float("-inf")  # nothing but -inf: token 0
    logits[3, [10, 20]] = float("inf")
    logits[4, [0, 299]] = torch.tensor([float("inf"), float("nan")])
    logits[5, 299] = 1e30  # the last token
    logits = logits.to(dtype)
    assert row_argmax(logits) == logits.argmax(-1).tolist()
    assert row_argmax(logits[:, 1:]) == logits[:, 1:].argmax(-1).tolist()  # not contiguous
    assert row_argmax(logits[:0]) == []
