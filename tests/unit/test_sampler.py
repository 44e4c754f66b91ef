"""The sampler's warpers against transformers' logits processors on the same logits."""

from __future__ import annotations

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from tritonllm.engine.sampler import warp


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
