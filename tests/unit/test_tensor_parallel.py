"""Tensor parallelism on CPU: two real processes joined by torch.distributed (gloo), each holding half of every
layer's heads and MLP and half of the KV cache. Greedy output equals one process's and transformers'
generate(), token for token, through batching, chunked prefill and the prefix cache."""

from __future__ import annotations

import pytest
from architectures import build_architecture
from oracles import greedy_ids
from transformers import AutoModelForCausalLM

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.parallel import tensor_parallel
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

PROMPTS = [[3 + i, 17, 250 + 7 * i, 9, 41 + i] * (1 + 3 * i) for i in range(5)]  # 5 to 65 tokens
SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28]  # a full block and more


def generate(model_dir, tensor_parallel_size: int, prompts: list[list[int]], max_tokens: int = 12) -> list:
    config = EngineConfig(
        str(model_dir),
        tensor_parallel_size=tensor_parallel_size,
        num_kv_blocks=256,
        max_num_batched_tokens=32,  # the longer prompts prefill in chunks
        engine_nice=0,
    )
    engine = LLMEngine(config)
    try:
        seqs = [Sequence(list(p), SamplingParams(max_tokens=max_tokens)) for p in prompts]
        for seq in seqs:
            engine.add(seq)
        while engine.has_work():
            engine.step()
        later = Sequence(SHARED + [5], SamplingParams(max_tokens=max_tokens))  # after SHARED + [4]: a prefix hit
        engine.add(later)
        while engine.has_work():
            engine.step()
        assert engine.blocks.prefix_hit_tokens > 0
        return [s.output_ids for s in [*seqs, later]]
    finally:
        engine.close()


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, tokenizer):
    """Biases on q, k and v (split with their rows), sliding-window layers, grouped KV heads."""
    return build_architecture("qwen2", tokenizer, tmp_path_factory.mktemp("qwen2"))


@pytest.mark.parametrize("model", ["tiny", "qwen2"])
def test_two_ranks_decode_greedily_as_one_and_as_transformers(model, tiny_model_dir, qwen2_dir):
    model_dir = tiny_model_dir if model == "tiny" else qwen2_dir
    prompts = [*PROMPTS, SHARED + [4]]
    split = generate(model_dir, 2, prompts)
    assert split == generate(model_dir, 1, prompts)
    hf = AutoModelForCausalLM.from_pretrained(model_dir)
    assert split == [greedy_ids(hf, p, 12) for p in [*prompts, SHARED + [5]]]


def test_a_split_that_does_not_cover_the_model_is_refused_at_load(tiny_model_dir):
    with pytest.raises(UnsupportedModelError, match="tensor_parallel_size=3: 4 attention heads"):
        LLMEngine(EngineConfig(str(tiny_model_dir), tensor_parallel_size=3, num_kv_blocks=64))


def test_a_row_parallel_layer_sums_its_shares_and_adds_the_bias_once():
    import torch

    linear = torch.nn.Linear(8, 3)
    shares = [tensor_parallel.RowParallelLinear(linear, rank, 2) for rank in range(2)]
    x = torch.randn(2, 8)
    partial = [torch.nn.functional.linear(x[:, 4 * r : 4 * r + 4], s.weight, s.bias) for r, s in enumerate(shares)]
    assert torch.allclose(partial[0] + partial[1], linear(x), atol=1e-6)
    assert shares[1].bias is None
