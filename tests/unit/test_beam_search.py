"""Beam search in the in-flight batch against transformers' generate(num_beams=...): same beams, same scores."""

from __future__ import annotations

import pytest
import torch
from oracles import beam_search

from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import FinishReason, Sequence

from .test_engine import make_engine, random_prompts, run

WIDTH, NEW_TOKENS = 4, 12


def end_id_and_bias(hf_model, prompt: list[int]) -> tuple[int, float]:
    """An end token the model likes enough (after a bias) that beams finish at different lengths."""
    greedy = hf_model.generate(
        torch.tensor([prompt], device=hf_model.device), max_new_tokens=4, do_sample=False, pad_token_id=0
    )
    return int(greedy[0, len(prompt) + 2]), 2.5


def hf_beams(hf_model, prompt, end_id, bias, length_penalty, early_stopping):
    return beam_search(hf_model, prompt, WIDTH, NEW_TOKENS, end_id, length_penalty, early_stopping, bias)


def beam_params(end_id, bias, length_penalty, early_stopping, vocab=4096) -> SamplingParams:
    embedding_bias = torch.zeros(vocab)
    embedding_bias[end_id] = bias
    return SamplingParams(
        max_tokens=NEW_TOKENS,
        end_id=end_id,
        embedding_bias=embedding_bias,
        beam_width=WIDTH,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, -0.7, 2.0])
def test_beams_and_scores_equal_generate(tiny_model_dir, hf_model, early_stopping, length_penalty):
    prompts = random_prompts(3, seed=11, max_len=40)
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=24)  # prompts chunked; beams decode beside them
    seqs, expected = [], []
    for prompt in prompts:
        end_id, bias = end_id_and_bias(hf_model, prompt)
        seqs.append(Sequence(prompt, beam_params(end_id, bias, length_penalty, early_stopping)))
        expected.append(hf_beams(hf_model, prompt, end_id, bias, length_penalty, early_stopping))
    run(engine, seqs, arrive_every=3)
    for seq, (beams, scores) in zip(seqs, expected, strict=True):
        results = seq.beam.results()
        assert [h.output_ids for h in results] == beams
        assert [h.score for h in results] == pytest.approx(scores, rel=1e-5, abs=1e-4)
        assert seq.finish_reason in (FinishReason.END_ID, FinishReason.LENGTH)
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_beams_survive_preemption_in_a_tight_pool(tiny_model_dir, hf_model):
    """Beams forked mid-block copy that block on write; preempted beams recompute; results do not change."""
    prompts = random_prompts(6, seed=12, max_len=30)
    outputs = []
    for num_kv_blocks in (512, 40):
        engine = make_engine(tiny_model_dir, num_kv_blocks=num_kv_blocks)
        seqs = []
        for prompt in prompts:
            end_id, bias = end_id_and_bias(hf_model, prompt)
            seqs.append(Sequence(prompt, beam_params(end_id, bias, 1.0, False)))
        run(engine, seqs)
        outputs.append([[(h.output_ids, round(h.score, 4)) for h in s.beam.results()] for s in seqs])
        assert engine.blocks.num_free == num_kv_blocks
        if num_kv_blocks == 40:
            assert engine.scheduler.num_preemptions > 0
    assert outputs[0] == outputs[1]
    beams, _ = hf_beams(hf_model, prompts[0], *end_id_and_bias(hf_model, prompts[0]), 1.0, False)
    assert [ids for ids, _ in outputs[1][0]] == beams


def test_cancelling_a_search_frees_every_beam(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    seq = Sequence(random_prompts(1, seed=13)[0], SamplingParams(max_tokens=50, beam_width=WIDTH))
    engine.add(seq)
    for _ in range(6):
        engine.step()
    assert len(seq.beam.live) == WIDTH
    engine.abort(seq)
    assert all(b.is_finished for b in seq.beam.live)
    assert len(seq.beam.results()) == WIDTH
    assert engine.blocks.num_free == engine.blocks.num_blocks
