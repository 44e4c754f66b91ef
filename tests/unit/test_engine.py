"""The engine against transformers' own generate(): greedy token for token, seeded sampling, block accounting."""

from __future__ import annotations

import pytest
import torch

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import FinishReason, Sequence


def make_engine(model_dir, **overrides) -> LLMEngine:
    settings = dict(num_kv_blocks=256, block_size=4, max_num_seqs=32, max_num_batched_tokens=64)
    settings.update(overrides)
    return LLMEngine(EngineConfig(str(model_dir), **settings))


def run(engine: LLMEngine, seqs: list[Sequence], arrive_every: int = 1) -> int:
    """Adds one sequence every `arrive_every` steps and steps until all finish; returns the step count."""
    pending, steps = list(seqs), 0
    while pending or engine.has_work():
        if pending and steps % arrive_every == 0:
            engine.add(pending.pop(0))
        engine.step()
        steps += 1
        assert steps < 10_000
    return steps


def random_prompts(n: int, seed: int, max_len: int = 70) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len, (n,), generator=g).tolist()
    return [torch.randint(7, 4096, (length,), generator=g).tolist() for length in lengths]


def reference(hf_model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    ids = torch.tensor([prompt], device=hf_model.device)
    out = hf_model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def check_staggered_greedy(engine: LLMEngine, hf_model) -> None:
    """16 prompts arriving every 2 steps: each greedy answer equals generate()'s, every KV block comes back."""
    prompts = random_prompts(16, seed=1)
    seqs = [Sequence(p, SamplingParams(max_tokens=24)) for p in prompts]
    run(engine, seqs, arrive_every=2)
    for prompt, seq in zip(prompts, seqs, strict=True):
        assert seq.finish_reason is FinishReason.LENGTH
        assert seq.output_ids == reference(hf_model, prompt, 24), f"prompt of {len(prompt)} tokens"
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_greedy_equals_transformers_generate_with_staggered_arrivals(tiny_model_dir, hf_model):
    check_staggered_greedy(make_engine(tiny_model_dir, max_num_batched_tokens=48), hf_model)  # prompts chunked


def test_end_id_stops_like_generate(tiny_model_dir, hf_model):
    prompt = random_prompts(1, seed=2)[0]
    free_run = reference(hf_model, prompt, 12)
    end_id = free_run[5]
    engine = make_engine(tiny_model_dir)
    seq = Sequence(prompt, SamplingParams(max_tokens=12, end_id=end_id))
    run(engine, [seq])
    assert seq.finish_reason is FinishReason.END_ID
    assert seq.output_ids == reference(hf_model, prompt, 12, eos=end_id)
    assert seq.output_ids[-1] == end_id


def test_preemption_does_not_change_outputs(tiny_model_dir):
    prompts = random_prompts(8, seed=3, max_len=30)

    def outputs(**overrides):
        engine = make_engine(tiny_model_dir, **overrides)
        seqs = [Sequence(p, SamplingParams(max_tokens=30, temperature=0.9, seed=i)) for i, p in enumerate(prompts)]
        run(engine, seqs)
        assert engine.blocks.num_free == engine.blocks.num_blocks
        return [s.output_ids for s in seqs], engine.scheduler.num_preemptions

    roomy, roomy_preemptions = outputs()
    tight, tight_preemptions = outputs(num_kv_blocks=40)  # 160 slots for 8 sequences of up to 59 tokens
    assert roomy_preemptions == 0
    assert tight_preemptions > 0
    assert tight == roomy


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_model_dir):
    prompt = random_prompts(1, seed=4)[0]
    params = SamplingParams(max_tokens=32, temperature=0.8, top_k=50, top_p=0.9, seed=123)

    alone = Sequence(prompt, params)
    run(make_engine(tiny_model_dir), [alone])

    crowd = [
        Sequence(p, SamplingParams(max_tokens=32, temperature=1.0, seed=i)) for i, p in enumerate(random_prompts(15, 5))
    ]
    together = Sequence(prompt, params)
    engine = make_engine(tiny_model_dir)
    run(engine, [*crowd[:7], together, *crowd[7:]])

    other_seed = Sequence(prompt, SamplingParams(max_tokens=32, temperature=0.8, top_k=50, top_p=0.9, seed=124))
    run(make_engine(tiny_model_dir), [other_seed])
    assert together.output_ids == alone.output_ids
    assert other_seed.output_ids != alone.output_ids


def test_abort_returns_every_block(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    seqs = [Sequence(p, SamplingParams(max_tokens=200)) for p in random_prompts(6, seed=6)]
    for seq in seqs:
        engine.add(seq)
    for _ in range(5):
        engine.step()
    assert engine.blocks.num_used > 0
    for seq in seqs:
        engine.abort(seq)
        assert seq.finish_reason is FinishReason.CANCELLED
    assert not engine.has_work()
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_sequence_longer_than_the_pool_ends_with_length(tiny_model_dir):
    engine = make_engine(tiny_model_dir, num_kv_blocks=8)  # 32 slots
    seq = Sequence([5] * 20, SamplingParams(max_tokens=100))
    run(engine, [seq])
    assert seq.finish_reason is FinishReason.LENGTH
    assert len(seq.token_ids) <= 32
    assert engine.blocks.num_free == engine.blocks.num_blocks


@pytest.mark.parametrize(
    ("prompt", "needle"),
    [([], "empty"), ([1, 2, 99999], "outside"), ([1] * 5000, "at most")],
)
def test_invalid_prompts_name_input_ids(tiny_model_dir, prompt, needle):
    engine = make_engine(tiny_model_dir)
    with pytest.raises(ValueError, match="input_ids") as info:
        engine.validate(prompt)
    assert needle in str(info.value)
