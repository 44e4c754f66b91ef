"""Gemma 3 (windowed layers interleaved with global ones) on the real tritonserver: concurrent streams of prompts
shorter and longer than the window, batched together, each greedy id for id as transformers' generate()."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from architectures import WINDOW, build_architecture
from conftest import launch_triton
from oracles import greedy_ids
from triton_helpers import Stream

from .test_triton import llm_inputs

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory, tokenizer):
    model_dir = build_architecture("gemma3_text", tokenizer, tmp_path_factory.mktemp("gemma3"))
    server = launch_triton(model_dir, tmp_path_factory.mktemp("triton-gemma3"))
    yield server, model_dir
    server.stop()


def test_gemma3_streams_equal_generate(gemma3):
    from transformers import AutoModelForCausalLM

    server, model_dir = gemma3
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(7, 4000, (n,), generator=g).tolist() for n in (4, WINDOW - 1, 2 * WINDOW, 5 * WINDOW)]

    def one(prompt: list[int]) -> list[int]:
        s = Stream(server.grpc_url)
        try:
            s.send("llm", llm_inputs(prompt, NEW_TOKENS))
            return [t for r in s.until_final() for t in r.as_numpy("output_ids").reshape(-1).tolist()]
        finally:
            s.close()

    with ThreadPoolExecutor(len(prompts)) as pool:
        outputs = list(pool.map(one, prompts))
    assert outputs == [greedy_ids(hf, p, NEW_TOKENS) for p in prompts]
