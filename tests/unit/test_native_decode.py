"""The native decoder stack (native_decode.py): which models it serves, greedy output through it equal to
transformers' generate() on the real default model and on the tiny families it takes, and a stack that
computes otherwise dropped at load rather than served."""

from __future__ import annotations

import pytest
import torch
import transformers
from architectures import build_architecture
from conftest import MODELS
from oracles import greedy_ids

from tritonllm.engine import native_decode
from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.sampling_params import SamplingParams
from tritonllm.engine.sequence import Sequence

SERVED = ["llama", "llama_biased", "qwen2_full"]
REFUSED = {"mistral": "sliding window", "gemma": "GemmaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@pytest.fixture(scope="module")
def families(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("native_decode")
    return {family: build_architecture(family, tokenizer, out) for family in [*SERVED, *REFUSED]}


def decoded_together(
    model_dir, prompts: list[list[int]], new_tokens: int, **settings
) -> tuple[LLMEngine, list[list[int]]]:
    """The prompts' greedy outputs, decoded in one batch (a step of several rows through the stack); `settings`:
    more engine settings."""
    engine = LLMEngine(EngineConfig(str(model_dir), num_kv_blocks=64, block_size=8, **settings))
    seqs = [Sequence(p, SamplingParams(max_tokens=new_tokens)) for p in prompts]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    assert engine.blocks.num_free == engine.blocks.num_blocks
    return engine, [s.output_ids for s in seqs]


def some_prompts(count: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(7, vocab, (5 + 9 * i,), generator=g).tolist() for i in range(count)]


@pytest.mark.parametrize("family", SERVED)
def test_served_families_decode_through_the_stack_as_generate(families, family):
    hf = transformers.AutoModelForCausalLM.from_pretrained(families[family]).eval()
    prompts = some_prompts(4, 4000)
    engine, outputs = decoded_together(families[family], prompts, 24)
    assert engine.runner.decoder_stack is not None
    assert outputs == [greedy_ids(hf, p, 24) for p in prompts]


def test_the_default_model_decodes_through_the_stack_as_generate():
    model_dir = MODELS / "SmolLM2-135M-Instruct"
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = some_prompts(3, hf.config.vocab_size)
    engine, outputs = decoded_together(model_dir, prompts, 16)
    assert engine.runner.decoder_stack is not None
    assert outputs == [greedy_ids(hf, p, 16) for p in prompts]


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_other_models_keep_transformers_modules_and_the_reason_is_named(families, family):
    engine = LLMEngine(EngineConfig(str(families[family]), num_kv_blocks=16, block_size=8))
    assert engine.runner.decoder_stack is None
    assert REFUSED[family] in native_decode.why_not(engine.runner.model)


def test_a_stack_that_computes_otherwise_is_dropped_at_load(families, monkeypatch):
    right = native_decode.NativeDecode.logits
    monkeypatch.setattr(native_decode.NativeDecode, "logits", lambda self, *a: right(self, *a) * 1.01)
    engine = LLMEngine(EngineConfig(str(families["llama"]), num_kv_blocks=16, block_size=8))
    assert engine.runner.decoder_stack is None


def test_prompt_chunks_beside_decodes_go_through_the_stack_exactly(families):
    """Prompts fed in chunks while others decode, steps mixing both: every step after load runs through the
    stack (transformers' modules never), and the greedy output is still generate()'s."""
    model_dir = families["llama"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = some_prompts(4, 4000)  # 5 to 32 tokens
    expected = [greedy_ids(hf, p, 12) for p in prompts]
    engine = LLMEngine(EngineConfig(str(model_dir), num_kv_blocks=64, block_size=8, max_num_batched_tokens=16))

    def refused(*args, **kwargs):
        raise AssertionError("a step ran through transformers' modules")

    engine.runner.model.forward = refused
    seqs = [Sequence(p, SamplingParams(max_tokens=12)) for p in prompts]
    for seq in seqs:
        engine.add(seq)
    mixed = 0
    while engine.has_work():
        fed = {s.seq_id: s.num_computed for s in seqs}
        engine.step()
        grew = [s.num_computed - fed[s.seq_id] for s in seqs if s.num_computed > fed[s.seq_id]]
        mixed += 1 in grew and any(n > 1 for n in grew)
    assert mixed, "no step carried a prompt chunk beside a decode"
    assert [s.output_ids for s in seqs] == expected
