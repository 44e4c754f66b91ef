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

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.execution import native_decode
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.formats import gguf

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
    settings = {"num_kv_blocks": 64, **settings}
    engine = LLMEngine(EngineConfig(str(model_dir), block_size=8, **settings))
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


@pytest.mark.parametrize("family", ["llama", "qwen2_full"])
def test_a_prompt_step_past_the_mlps_row_chunk_decodes_as_generate(families, family):
    """Prompts taken in together as one step of more rows than the stack's MLP takes at once (kMlpRows, 512 in
    decoder_layers.cpp): their rows go through the MLP in chunks, and greedy output is still generate()'s."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(families[family]).eval()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(7, 4000, (length,), generator=g).tolist() for length in (300, 280, 250, 330)]
    engine, outputs = decoded_together(families[family], prompts, 6, num_kv_blocks=256)
    assert engine.runner.decoder_stack is not None
    assert outputs == [greedy_ids(hf, p, 6) for p in prompts]


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


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "int8"])
@pytest.mark.parametrize("family", ["llama", "qwen2_full"])
def test_the_phased_forward_gives_the_bits_of_a_region_per_operation(families, family, kv_cache_dtype):
    """Steps of up to NATIVE_ROWS rows go through one parallel region of phases whose units a waiting thread
    recomputes when their owner overruns (phase_board.h). Over random caches and inputs, its output equals the
    region-per-operation forward's bit for bit, also when a thread holds units as if preempted, the other thread
    recomputes them, and the holder computes them again afterwards."""
    config = EngineConfig(str(families[family]), num_kv_blocks=128, block_size=8, kv_cache_dtype=kv_cache_dtype)
    assert_phased_equals_regions(LLMEngine(config).runner.decoder_stack.stack)


@pytest.mark.parametrize("int8_activations", [False, True])
def test_the_phased_forward_over_gguf_blocks_gives_the_bits_of_a_region_per_operation(smollm2_gguf, int8_activations):
    """The same over the wheel's Q4_1 file (the output layer aside, every projection in 4-bit blocks), with the
    exact kernel and with 8-bit inputs (each thread rounds a phase's input for itself)."""
    model_dir = str(gguf.hf_model_dir(smollm2_gguf, dequantize=True))
    config = EngineConfig(
        model_dir, num_kv_blocks=128, block_size=8, gguf_file=str(smollm2_gguf), int8_activations=int8_activations
    )
    assert_phased_equals_regions(LLMEngine(config).runner.decoder_stack.stack)


def test_the_phased_forward_over_a_gguf_files_own_blocks_gives_the_bits_of_a_region_per_operation(smollm2_gguf):
    """The same with the layers reading the file in place (gguf_linear.py): q/k/v and gate/up as separate
    projections side by side, the output layer in the file's Q8_0."""
    config = EngineConfig(str(gguf.hf_model_dir(smollm2_gguf)), num_kv_blocks=128, block_size=8)
    stack = LLMEngine(config).runner.decoder_stack.stack
    assert all(len(qkv) == 3 and len(gate_up) == 2 for qkv, gate_up in zip(stack.qkv, stack.gate_up, strict=True))
    assert_phased_equals_regions(stack)


def assert_phased_equals_regions(stack) -> None:
    g = torch.Generator().manual_seed(3)
    for cache in [*stack.k_cache, *stack.v_cache]:
        cache.copy_(
            torch.randn(cache.shape, generator=g).to(cache.dtype)
            if cache.is_floating_point()
            else torch.randint(-127, 128, cache.shape, generator=g, dtype=cache.dtype)
        )
    for scales in [*stack.k_scales, *stack.v_scales]:
        scales.copy_(torch.rand(scales.shape, generator=g) / 50)
    width = stack.input_norm[0].numel()
    for rows in (1, 3, 17, 64):
        hidden = torch.randn(rows, width, generator=g)
        cos, sin = torch.randn(rows, stack.dim, generator=g), torch.randn(rows, stack.dim, generator=g)
        blocks = torch.randperm(128, generator=g)[: 2 * rows].view(rows, 2)  # each row a sequence of its own
        lengths = torch.randint(1, 17, (rows,), generator=g)
        slots = blocks.gather(1, ((lengths - 1) // 8).unsqueeze(1)).squeeze(1) * 8 + (lengths - 1) % 8
        args = (hidden, cos, sin, slots, blocks, lengths)
        stack.phased = False
        expected = stack.forward(*args)
        stack.phased = True
        assert torch.equal(stack.forward(*args), expected), rows
        before = stack.recomputed
        stack.hold_every = 2  # units 0, 2, ... of a phase: their taker holds them until another thread computed them
        assert torch.equal(stack.forward(*args), expected), rows
        stack.hold_every = 0
        if torch.get_num_threads() > 1:
            assert stack.recomputed > before, "no held unit was recomputed"
