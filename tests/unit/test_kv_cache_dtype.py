"""kv_cache_dtype=bfloat16: the KV cache holds keys and values rounded to bfloat16 and everything else computes in
float32, so the engine's greedy output must equal transformers' generate() with an attention that rounds its keys
and values the same way; the native kernel reads such a cache exactly as the float32 widening of it; the pool
holds twice the tokens in the same memory."""

from __future__ import annotations

import pytest
import torch
import transformers
from architectures import build_architecture
from conftest import MODELS
from oracles import greedy_ids
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from tritonllm.engine import cpu_kernels
from tritonllm.engine.engine import EngineConfig, LLMEngine

from .test_native_decode import decoded_together

cpu_kernels.build()  # a build that fails is this module's error, never a skip
ROUNDED_KV = "bf16_rounded_kv_sdpa"


def rounded_kv_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention over keys and values rounded to bfloat16, in float32."""
    rounded = key.to(torch.bfloat16).float(), value.to(torch.bfloat16).float()
    return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, *rounded, attention_mask, **kwargs)


AttentionInterface.register(ROUNDED_KV, rounded_kv_attention)
AttentionMaskInterface.register(ROUNDED_KV, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # windows masked as for SDPA


def oracle(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=ROUNDED_KV).eval()


def prompts_for(vocab: int, count: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(7, vocab, (4 + 11 * i,), generator=g).tolist() for i in range(count)]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory, tokenizer):
    """A family the native decoder stack does not take (a sliding window): the PyTorch attention path."""
    return build_architecture("mistral", tokenizer, tmp_path_factory.mktemp("kv_dtype"))


@pytest.mark.parametrize("model", ["tiny", "SmolLM2-135M-Instruct", "mistral"])
def test_greedy_with_a_bfloat16_cache_equals_generate_over_rounded_keys_and_values(model, mistral):
    model_dir = mistral if model == "mistral" else MODELS / model
    prompts = prompts_for(4000)
    engine, outputs = decoded_together(model_dir, prompts, 20, kv_cache_dtype="bfloat16")
    assert engine.runner.cache.key[0].dtype == torch.bfloat16
    assert (engine.runner.decoder_stack is not None) == (model != "mistral")
    hf = oracle(model_dir)
    assert outputs == [greedy_ids(hf, p, 20) for p in prompts]


def test_the_kernel_reads_a_bfloat16_cache_as_its_float32_widening():
    g = torch.Generator().manual_seed(5)
    for q_heads, kv_heads, dim, block_size, window, softcap in [(8, 2, 64, 16, 0, 0.0), (6, 3, 33, 5, 7, 5.0)]:
        k = torch.randn(64, block_size, kv_heads, dim, generator=g).to(torch.bfloat16)
        v = torch.randn(64, block_size, kv_heads, dim, generator=g).to(torch.bfloat16)
        q = torch.randn(5, q_heads, dim, generator=g) * 3
        lens = torch.tensor([1, block_size + 1, 37, 3 * block_size, 50])
        tables = torch.randperm(64, generator=g)[: 5 * 10].view(5, 10)
        args = (tables, lens, dim**-0.5, window, softcap)
        kernel = cpu_kernels.native().paged_decode_attention
        assert torch.equal(kernel(q, k, v, *args), kernel(q, k.float(), v.float(), *args))


def test_the_same_memory_holds_twice_the_tokens():
    sized = {
        d: LLMEngine(EngineConfig(str(MODELS / "tiny"), kv_cache_memory="4MiB", kv_cache_dtype=d))
        for d in ("float32", "bfloat16")
    }
    assert sized["bfloat16"].blocks.num_blocks == 2 * sized["float32"].blocks.num_blocks
    assert sized["bfloat16"].kv_cache_bytes <= 4 << 20 and sized["float32"].kv_cache_bytes <= 4 << 20


def test_other_cache_dtypes_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="kv_cache_dtype: 'int8' is not allowed"):
        EngineConfig(str(MODELS / "tiny"), kv_cache_dtype="int8")
