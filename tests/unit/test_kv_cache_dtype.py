"""kv_cache_dtype: the KV cache holds keys and values rounded to bfloat16, or as int8 with a float32 scale per head
vector (its largest magnitude / 127, values rounded to nearest even), and everything else computes in float32. So
the engine's greedy output must equal transformers' generate() with an attention that rounds its keys and values
the same way; the native kernel reads such a cache exactly as the float32 values it stands for; the pool holds
twice (bfloat16) or 3.8 times (int8) the tokens in the same memory."""

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

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

from .test_native_decode import decoded_together

cpu_kernels.build()  # a build that fails is this module's error, never a skip


def bf16_rounded(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def int8_quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and the scale of each vector along the last axis."""
    scale = x.abs().amax(-1, keepdim=True) / 127
    values = torch.where(scale > 0, torch.round(x / torch.where(scale > 0, scale, 1)), 0).clamp(-127, 127)
    return values.to(torch.int8), scale[..., 0]


def int8_rounded(x: torch.Tensor) -> torch.Tensor:
    values, scale = int8_quantized(x.float())
    return values.float() * scale[..., None]


ROUNDINGS = {"bfloat16": bf16_rounded, "int8": int8_rounded}


def register(kv_dtype: str) -> str:
    """transformers' SDPA attention over keys and values rounded as the `kv_dtype` cache holds them, in float32."""
    name, rounded = f"{kv_dtype}_rounded_kv_sdpa", ROUNDINGS[kv_dtype]

    def attention(module, query, key, value, attention_mask, **kwargs):
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, rounded(key), rounded(value), attention_mask, **kwargs)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # windows masked as for SDPA
    return name


ORACLES = {kv_dtype: register(kv_dtype) for kv_dtype in ROUNDINGS}


def prompts_for(vocab: int, count: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(7, vocab, (4 + 11 * i,), generator=g).tolist() for i in range(count)]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory, tokenizer):
    """A family the native decoder stack does not take (a sliding window): the PyTorch attention path."""
    return build_architecture("mistral", tokenizer, tmp_path_factory.mktemp("kv_dtype"))


def near_tie_gap(hf, prompt: list[int], output: list[int]) -> float:
    """How far below the oracle's best the engine's tokens score, teacher-forced, as a share of each step's largest
    logit: 0 where they are the oracle's greedy choices. A rounded cache turns fp32 noise in a key (a prefill's
    against a decode's arithmetic) into a whole rounding step now and then, so a near tie may go the other way."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(output)]
    chosen = logits.gather(1, torch.tensor(output)[:, None])[:, 0]
    return ((logits.max(-1).values - chosen) / logits.abs().max(-1).values).max().item()


@pytest.mark.parametrize("kv_dtype", sorted(ROUNDINGS))
@pytest.mark.parametrize("model", ["tiny", "SmolLM2-135M-Instruct", "mistral"])
def test_greedy_follows_generate_over_keys_and_values_rounded_as_the_cache_holds_them(model, kv_dtype, mistral):
    model_dir = mistral if model == "mistral" else MODELS / model
    prompts = prompts_for(4000)
    engine, outputs = decoded_together(model_dir, prompts, 20, kv_cache_dtype=kv_dtype)
    assert engine.runner.cache.key[0].dtype == getattr(torch, kv_dtype)
    assert (engine.runner.decoder_stack is not None) == (model != "mistral")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=ORACLES[kv_dtype]).eval()
    assert max(near_tie_gap(hf, p, o) for p, o in zip(prompts, outputs, strict=True)) < 0.01
    if model == "tiny":  # no near tie on these prompts: token for token
        assert outputs == [greedy_ids(hf, p, 20) for p in prompts]


def test_the_native_stack_quantizes_as_the_pytorch_path():
    """The same run with the native decoder stack writing the int8 cache and with transformers' modules (the
    PyTorch path) writing it, from the same state after the load: the same values, but where fp32 noise in a key
    crosses a rounding boundary."""
    engines = []
    for native in (True, False):
        engine = LLMEngine(EngineConfig(str(MODELS / "tiny"), num_kv_blocks=64, block_size=8, kv_cache_dtype="int8"))
        assert engine.runner.decoder_stack is not None  # kept after the load's check against transformers
        engine.runner.decoder_stack = engine.runner.decoder_stack if native else None
        for prompt in prompts_for(4000):
            engine.add(Sequence(prompt, SamplingParams(max_tokens=8)))
        while engine.has_work():
            engine.step()
        engines.append(engine.runner.cache)
    native, modules = engines
    for a, b in zip((*native.key, *native.value), (*modules.key, *modules.value), strict=True):
        written = (a != 0) | (b != 0)
        differ = (a.int() - b.int()).abs()
        assert written.sum() > 1000 and differ.max() <= 1 and differ[written].float().mean() < 0.01
    for a, b in zip((*native.key_scale, *native.value_scale), (*modules.key_scale, *modules.value_scale), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=0)


@pytest.mark.parametrize("kv_dtype", sorted(ROUNDINGS))
def test_the_kernel_reads_a_cache_as_the_float32_values_it_stands_for(kv_dtype):
    g = torch.Generator().manual_seed(5)
    kernel = cpu_kernels.native().paged_decode_attention
    for q_heads, kv_heads, dim, block_size, window, softcap in [(8, 2, 64, 16, 0, 0.0), (6, 3, 33, 5, 7, 5.0)]:
        k, v = (torch.randn(64, block_size, kv_heads, dim, generator=g) for _ in range(2))
        q = torch.randn(5, q_heads, dim, generator=g) * 3
        lens = torch.tensor([1, block_size + 1, 37, 3 * block_size, 50])
        args = (torch.randperm(64, generator=g)[: 5 * 10].view(5, 10), lens, dim**-0.5, window, softcap)
        none = torch.empty(0)
        if kv_dtype == "int8":
            (kq, ks), (vq, vs) = int8_quantized(k), int8_quantized(v)
            held = kernel(q, kq, vq, *args, ks, vs)
        else:
            held = kernel(q, k.to(torch.bfloat16), v.to(torch.bfloat16), *args, none, none)
        assert torch.equal(held, kernel(q, ROUNDINGS[kv_dtype](k), ROUNDINGS[kv_dtype](v), *args, none, none))


def test_the_same_memory_holds_more_tokens():
    blocks = {
        d: LLMEngine(EngineConfig(str(MODELS / "tiny"), kv_cache_memory="4MiB", kv_cache_dtype=d)).blocks.num_blocks
        for d in ("float32", "bfloat16", "int8")
    }
    assert blocks["bfloat16"] == 2 * blocks["float32"]
    head_dim = 32  # tiny's: 32 int8 values and a float32 scale against 32 float32 values
    assert blocks["int8"] == pytest.approx(blocks["float32"] * 4 * head_dim / (head_dim + 4), abs=1)


def test_other_cache_dtypes_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="kv_cache_dtype: 'fp8' is not allowed"):
        EngineConfig(str(MODELS / "tiny"), kv_cache_dtype="fp8")
