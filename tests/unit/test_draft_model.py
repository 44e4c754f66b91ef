"""Speculative decoding with a draft model (engine/speculation/draft_model.py): greedy output equal to generate()
whether the drafts are all kept or often rejected; seeded sampling independent of the batch; the draft model's pool
empty again when the sequences end; a draft model with another vocabulary refused at load."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import MODELS
from transformers import AutoModelForCausalLM

from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

from .test_engine import make_engine, random_prompts, reference, run


@pytest.fixture(scope="module")
def noisy_draft(tiny_model_dir, tmp_path_factory):
    """The tiny model with noise on every weight: it agrees with the tiny model on some tokens, not all."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * 0.03)
    path = tmp_path_factory.mktemp("noisy-draft")
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, path / name)
    return path


def recorded(drafter) -> list[tuple[list[int], list[int]]]:
    """(the target's tokens, the drafts for them) of every sequence the drafter drafts for from now on."""
    proposals, draft = [], drafter.draft

    def recording(rooms):
        drafts = draft(rooms)
        proposals.extend((list(seq.token_ids), d) for seq, d in drafts.items())
        return drafts

    drafter.draft = recording
    return proposals


def draft_engine(target, draft, **settings):
    return make_engine(target, speculative="draft_model", speculative_model=str(draft), **settings)


@pytest.mark.parametrize("max_num_batched_tokens", [64, 9])  # 9: drafts cut to fit the step's budget
def test_greedy_with_a_noisy_draft_model_equals_generate(tiny_model_dir, hf_model, noisy_draft, max_num_batched_tokens):
    engine = draft_engine(tiny_model_dir, noisy_draft, max_num_batched_tokens=max_num_batched_tokens)
    proposals = recorded(engine.draft_model)
    prompts = random_prompts(8, seed=17)
    seqs = [Sequence(p, SamplingParams(max_tokens=20)) for p in prompts]
    run(engine, seqs, arrive_every=2)
    for seq, prompt in zip(seqs, prompts, strict=True):
        assert seq.output_ids == reference(hf_model, prompt, 20)
    # each draft is the draft model's own greedy continuation, after rejections as before them
    draft_model = AutoModelForCausalLM.from_pretrained(noisy_draft).eval()
    for tokens, drafts in proposals[::7]:
        assert drafts == reference(draft_model, tokens, len(drafts))
    stats = engine.stats
    assert stats.draft_tokens > stats.accepted_draft_tokens > 0  # some drafts kept, some not
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert engine.draft_model.blocks.num_free == engine.draft_model.blocks.num_blocks


def test_the_model_as_its_own_draft_keeps_every_draft(tiny_model_dir, hf_model):
    engine = draft_engine(tiny_model_dir, tiny_model_dir, num_speculative_tokens=3)
    prompt = random_prompts(1, seed=5)[0]
    seq = Sequence(prompt, SamplingParams(max_tokens=25))
    steps = run(engine, [seq])
    assert seq.output_ids == reference(hf_model, prompt, 25)
    assert engine.stats.accepted_draft_tokens == engine.stats.draft_tokens > 0
    assert steps <= 1 + -(-25 // 4)  # the prompt's step, then four tokens a step


def test_seeded_sampling_with_a_draft_model_does_not_depend_on_the_batch(tiny_model_dir, noisy_draft):
    prompt = random_prompts(1, seed=9)[0]
    params = SamplingParams(max_tokens=24, temperature=0.2, seed=5)
    alone = Sequence(prompt, params)
    first = draft_engine(tiny_model_dir, noisy_draft)
    run(first, [alone])
    crowd = [
        Sequence(p, SamplingParams(max_tokens=24, temperature=1.0, seed=i)) for i, p in enumerate(random_prompts(7, 6))
    ]
    greedy = [Sequence(p, SamplingParams(max_tokens=24)) for p in random_prompts(3, 8)]
    together = Sequence(prompt, params)
    run(
        draft_engine(tiny_model_dir, noisy_draft, max_num_batched_tokens=12),
        [*crowd[:4], together, *greedy, *crowd[4:]],
    )
    assert first.stats.accepted_draft_tokens > 0
    assert together.output_ids == alone.output_ids


def test_a_draft_model_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model_dir, other)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODELS / "SmolLM2-135M-Instruct" / name, other / name)
    with pytest.raises(ValueError, match="speculative_model: .* has another tokenizer"):
        draft_engine(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": 49152}))
    with pytest.raises(ValueError, match=r"speculative_model: its vocabulary \(49152\) is larger"):
        draft_engine(tiny_model_dir, other)


def test_draft_model_and_its_folder_come_together(tiny_model_dir):
    with pytest.raises(ValueError, match="speculative_model"):
        make_engine(tiny_model_dir, speculative="draft_model")
    with pytest.raises(ValueError, match="speculative_model"):
        make_engine(tiny_model_dir, speculative="ngram", speculative_model=str(tiny_model_dir))
