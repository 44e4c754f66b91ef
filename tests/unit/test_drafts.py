"""Draft tokens verified in one step: greedy output never changes; sampling keeps the target distribution."""

from __future__ import annotations

import torch

from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence, Speculation

from .test_engine import make_engine, random_prompts, run


def first_step(engine, seq: Sequence) -> list[int]:
    engine.add(seq)
    return next(o.new_token_ids for o in engine.step() if o.seq is seq)


def test_greedy_output_is_the_same_with_right_or_wrong_drafts(tiny_model_dir):
    prompt = random_prompts(1, seed=31)[0]
    plain = Sequence(prompt, SamplingParams(max_tokens=16, repetition_penalty=1.2))
    run(make_engine(tiny_model_dir), [plain])
    free = plain.output_ids

    right = Sequence(prompt, SamplingParams(max_tokens=16, repetition_penalty=1.2), speculation=Speculation(free[:4]))
    engine = make_engine(tiny_model_dir)
    assert first_step(engine, right) == free[:5]  # four accepted, plus one
    assert right.speculation.accepted_drafts == 4
    run(engine, [])
    assert right.output_ids == free

    wrong_guess = (free[2] + 1) % 4096
    wrong = Sequence(
        prompt,
        SamplingParams(max_tokens=16, repetition_penalty=1.2),
        speculation=Speculation([*free[:2], wrong_guess, 5]),
    )
    engine = make_engine(tiny_model_dir)
    assert first_step(engine, wrong) == free[:3]  # two accepted, then the model's own token
    assert wrong.speculation.accepted_drafts == 2
    run(engine, [])
    assert wrong.output_ids == free
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_drafts_after_a_chunked_prompt_are_verified_right_after_it(tiny_model_dir):
    prompt = random_prompts(1, seed=32, max_len=70)[0] + list(range(40))
    plain = Sequence(prompt, SamplingParams(max_tokens=8))
    run(make_engine(tiny_model_dir), [plain])
    drafted = Sequence(prompt, SamplingParams(max_tokens=8), speculation=Speculation(plain.output_ids[:3]))
    run(make_engine(tiny_model_dir, max_num_batched_tokens=16), [drafted])
    assert drafted.output_ids == plain.output_ids


def test_speculative_sampling_keeps_the_target_distribution(tiny_model_dir, hf_model):
    prompt = random_prompts(1, seed=33)[0]
    temperature = 4.0
    with torch.no_grad():
        p = (hf_model(torch.tensor([prompt])).logits[0, -1] / temperature).softmax(-1)
    draft = int(torch.topk(p, 2).indices[1])  # a guess the target often, but not always, agrees with
    trials = 400
    engine = make_engine(tiny_model_dir, max_num_seqs=trials, num_kv_blocks=4096)
    seqs = [
        Sequence(
            prompt, SamplingParams(max_tokens=1, temperature=temperature, seed=i), speculation=Speculation([draft])
        )
        for i in range(trials)
    ]
    run(engine, seqs)
    accepted = sum(s.speculation.accepted_drafts for s in seqs) / trials
    first = torch.tensor([s.output_ids[0] for s in seqs])
    top = int(p.argmax())
    assert abs(accepted - float(p[draft])) < 0.08  # kept with probability p(draft) when q puts all mass on it
    assert abs(float((first == draft).float().mean()) - float(p[draft])) < 0.08
    assert abs(float((first == top).float().mean()) - float(p[top])) < 0.08


def test_draft_logits_equal_to_the_target_accept_every_draft(tiny_model_dir, hf_model):
    prompt = random_prompts(1, seed=34)[0]
    temperature = 2.0
    greedy = Sequence(prompt, SamplingParams(max_tokens=3))
    run(make_engine(tiny_model_dir), [greedy])
    drafts = greedy.output_ids[:2]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + drafts])).logits[0, len(prompt) - 1 : len(prompt) + 1]
    seqs = [
        Sequence(
            prompt,
            SamplingParams(max_tokens=4, temperature=temperature, seed=i),
            speculation=Speculation(drafts, logits / temperature),  # q == p: min(1, p/q) == 1
        )
        for i in range(20)
    ]
    run(make_engine(tiny_model_dir), seqs)
    assert all(s.speculation.accepted_drafts == 2 and s.output_ids[:2] == drafts for s in seqs)
