"""Every architecture family users serve, against transformers' own generate(): greedy ids token for token.

Prompts shorter and longer than the sliding window (16 tokens) run batched together, with chunked prefill, a
shared prefix from the cache, and decodes through the native kernel; the same again on the PyTorch path.
Models the engine cannot serve exactly are refused at load, naming why.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from architectures import ARCHITECTURES, WINDOW, build_architecture
from oracles import greedy_ids

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.execution import native_decode
from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers import paged_attention
from tritonllm.engine.models import llama_model
from tritonllm.engine.models.llama_model import ModelConfig
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

NEW_TOKENS = 12
WINDOWED = {"mistral", "qwen2", "mixtral", "gemma2", "gemma3_text", "phi3"}


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    short, crossing, long = (torch.randint(7, 4000, (n,), generator=g).tolist() for n in (5, WINDOW - 2, 3 * WINDOW))
    return [short, crossing, long, long[: 2 * WINDOW] + short]  # the last shares 2 * WINDOW cached tokens with `long`


@pytest.fixture(scope="module")
def architectures_dir(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("architectures")
    for family in ARCHITECTURES:
        build_architecture(family, tokenizer, out)
    return out


def engine_outputs(model_dir, prompt_list: list[list[int]], native: bool = True) -> list[list[int]]:
    """The engine's greedy outputs; `native`: whether its decode steps must run the native kernels (and, where
    native_decode.why_not finds nothing against it, the native decoder stack) or must not."""
    # 24-token steps: the long prompts are chunked; 8-token blocks: the shared prefix is two full blocks.
    engine = LLMEngine(EngineConfig(str(model_dir), num_kv_blocks=64, block_size=8, max_num_batched_tokens=24))
    runner = engine.runner
    assert runner.native_decode is native
    # the Llama family is built without transformers' model code wherever the native kernels run
    assert runner.transformers is not (native and llama_model.why_not(ModelConfig.read(model_dir), model_dir) is None)
    stack = native and native_decode.why_not(runner.model) is None
    assert (runner.decoder_stack is not None) is stack, native_decode.why_not(runner.model)
    seqs = [Sequence(p, SamplingParams(max_tokens=NEW_TOKENS)) for p in prompt_list]
    engine.add(seqs[0])
    engine.add(seqs[1])
    engine.add(seqs[2])
    while seqs[2].num_computed < len(prompt_list[2]):  # `long` cached before its prefix's twin arrives
        engine.step()
    engine.add(seqs[3])
    while engine.has_work():
        engine.step()
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert engine.blocks.prefix_hit_tokens == 2 * WINDOW  # the last prompt's start, four blocks of 8
    return [s.output_ids for s in seqs]


@pytest.mark.parametrize("native", [True, False], ids=["native-decode", "pytorch-decode"])
@pytest.mark.parametrize("family", list(ARCHITECTURES))
def test_greedy_equals_generate(architectures_dir, family, native, monkeypatch):
    if not native:
        monkeypatch.setattr(cpu_kernels, "native", lambda: None)
    model_dir = architectures_dir / family
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt_list = prompts()
    expected = [greedy_ids(hf, p, NEW_TOKENS) for p in prompt_list]
    assert engine_outputs(model_dir, prompt_list, native) == expected


@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_the_window_changes_these_outputs(architectures_dir, family):
    """The oracle above can fail: without its window, each windowed model answers the long prompts otherwise."""
    model_dir = architectures_dir / family
    windowed = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    unbounded = transformers.AutoModelForCausalLM.from_pretrained(model_dir, sliding_window=10**6).eval()
    long = prompts()[2]
    assert greedy_ids(windowed, long, NEW_TOKENS) != greedy_ids(unbounded, long, NEW_TOKENS)


_SMALL = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64
)
# family -> (config class, settings, what the refusal names)
REFUSED = {
    # attention sinks: an argument the paged attention does not implement
    "gpt_oss": ("GptOssConfig", {**_SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}, "s_aux"),
    # ALiBi inside Bloom's own attention code, which never calls the attention interface
    "bloom": ("BloomConfig", {"hidden_size": 64, "n_layer": 2, "n_head": 4}, "do not attend"),
    # linear-attention layers beside full ones
    "qwen3_next": (
        "Qwen3NextConfig",
        {
            **_SMALL,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
        },
        "linear_attention",
    ),  # fmt: skip
    "embedding_gemma": ("Gemma3TextConfig", {**_SMALL, "use_bidirectional_attention": True}, "bidirectional"),
    # attention code of its own (not transformers' AttentionInterface)
    "gpt_neo": (
        "GPTNeoConfig",
        {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "attention_types": [[["global"], 2]]},
        "Interface",
    ),
}


@pytest.mark.parametrize("family", list(REFUSED))
def test_models_it_cannot_serve_exactly_are_refused_at_load(tmp_path, tokenizer, family):
    class_name, settings, needle = REFUSED[family]
    torch.manual_seed(0)
    config = getattr(transformers, class_name)(vocab_size=len(tokenizer), **settings)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=needle):
        LLMEngine(EngineConfig(str(tmp_path), num_kv_blocks=16, block_size=8))


def test_an_attention_that_ignores_the_window_is_refused(architectures_dir, monkeypatch):
    """The load-time probe compares with eager attention: a paged path that loses the window cannot load."""
    original = paged_attention.paged_attention

    def windowless(*args, sliding_window=None, **kwargs):
        return original(*args, **kwargs)

    monkeypatch.setitem(
        transformers.AttentionInterface._global_mapping, paged_attention.ATTN_IMPLEMENTATION, windowless
    )
    with pytest.raises(UnsupportedModelError, match="differ from transformers' eager attention"):
        LLMEngine(EngineConfig(str(architectures_dir / "mistral"), num_kv_blocks=16, block_size=8))


def test_a_multimodal_model_is_refused_at_load_naming_its_tower(tmp_path, tokenizer):
    """A LLaVA folder: its config nests a text model and a vision tower, which the engine does not run; the load
    says so instead of reading a text model's fields from the composite config."""
    torch.manual_seed(0)
    text = transformers.LlamaConfig(vocab_size=len(tokenizer) + 1, **_SMALL)
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    config = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_index=len(tokenizer))
    transformers.LlavaForConditionalGeneration(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=r"llava is a multimodal model \(vision_config\)"):
        LLMEngine(EngineConfig(str(tmp_path), num_kv_blocks=16, block_size=8))
