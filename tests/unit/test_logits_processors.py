"""Logits processing against transformers' processors on the same inputs, and generation with them."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from tritonllm.engine.decoding.logits_processors import process
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import FinishReason, Sequence

from .test_engine import make_engine, random_prompts, run

VOCAB = 4096
PROMPT = [5, 9, 5, 17, 9, 5, 300, 17]
OUTPUT = [9, 5, 42, 9, 5]
BIAS = {7: 2.5, 42: -1.0, 300: 0.75}
BAD_WORDS = [[42], [5, 300], [9, 5, 77]]


def sequence(**params) -> Sequence:
    seq = Sequence(PROMPT, SamplingParams(**params))
    seq.token_ids += OUTPUT
    return seq


def bias_tensor() -> torch.Tensor:
    bias = torch.zeros(VOCAB)
    for token, value in BIAS.items():
        bias[token] = value
    return bias


def hf(processor, logits: torch.Tensor) -> torch.Tensor:
    return processor(torch.tensor([PROMPT + OUTPUT]), logits[None].clone())[0]


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 4


@pytest.mark.parametrize(
    ("params", "processor"),
    [
        ({"embedding_bias": bias_tensor()}, SequenceBiasLogitsProcessor({(t,): v for t, v in BIAS.items()})),
        ({"repetition_penalty": 1.7}, RepetitionPenaltyLogitsProcessor(1.7)),
        ({"repetition_penalty": 0.6}, RepetitionPenaltyLogitsProcessor(0.6)),
        ({"no_repeat_ngram_size": 2}, NoRepeatNGramLogitsProcessor(2)),
        ({"no_repeat_ngram_size": 3}, NoRepeatNGramLogitsProcessor(3)),
        ({"bad_words": BAD_WORDS}, NoBadWordsLogitsProcessor(BAD_WORDS)),
        ({"min_tokens": 9, "end_id": 3}, MinNewTokensLengthLogitsProcessor(len(PROMPT), 9, 3)),
        ({"min_tokens": 5, "end_id": 3}, MinNewTokensLengthLogitsProcessor(len(PROMPT), 5, 3)),
    ],
)
def test_each_processor_equals_transformers(logits, params, processor):
    assert torch.equal(process(logits, sequence(**params)), hf(processor, logits))


def test_all_together_equal_transformers_in_its_order(logits):
    params = dict(embedding_bias=bias_tensor(), repetition_penalty=1.3, no_repeat_ngram_size=2, bad_words=BAD_WORDS)
    processors = LogitsProcessorList(
        [
            SequenceBiasLogitsProcessor({(t,): v for t, v in BIAS.items()}),
            RepetitionPenaltyLogitsProcessor(1.3),
            NoRepeatNGramLogitsProcessor(2),
            NoBadWordsLogitsProcessor(BAD_WORDS),
        ]
    )
    assert torch.equal(process(logits, sequence(**params)), hf(processors, logits))


def test_presence_and_frequency_penalties_count_output_tokens_only(logits):
    expected = logits.clone()
    for token in set(OUTPUT):
        expected[token] -= 0.5 + 0.25 * OUTPUT.count(token)
    got = process(logits, sequence(presence_penalty=0.5, frequency_penalty=0.25))
    assert torch.allclose(got, expected)
    assert got[300] == logits[300]  # in the prompt only


def generate_ids(hf_model, prompt: list[int], **kwargs) -> list[int]:
    out = hf_model.generate(torch.tensor([prompt]), do_sample=False, pad_token_id=0, **kwargs)
    return out[0, len(prompt) :].tolist()


def test_greedy_generation_with_processors_equals_generate(tiny_model_dir, hf_model):
    prompts = random_prompts(6, seed=11, max_len=30)
    bias = bias_tensor()
    frees = [generate_ids(hf_model, p, max_new_tokens=20) for p in prompts]
    end_id = frees[0][3]  # a token greedy decoding reaches early, so min_tokens has something to hold off
    bad = [[frees[1][2]], [frees[2][4], frees[2][5]]]
    params = SamplingParams(
        max_tokens=20,
        end_id=end_id,
        embedding_bias=bias,
        repetition_penalty=1.2,
        no_repeat_ngram_size=2,
        bad_words=bad,
        min_tokens=6,
    )
    seqs = [Sequence(p, params) for p in prompts]
    run(make_engine(tiny_model_dir), seqs)
    for prompt, seq in zip(prompts, seqs, strict=True):
        expected = generate_ids(
            hf_model,
            prompt,
            max_new_tokens=20,
            eos_token_id=end_id,
            sequence_bias={(t,): v for t, v in BIAS.items()},
            repetition_penalty=1.2,
            no_repeat_ngram_size=2,
            bad_words_ids=bad,
            min_new_tokens=6,
        )
        assert seq.output_ids == expected


def test_stop_words_end_the_output_after_the_word(tiny_model_dir, hf_model):
    prompt = random_prompts(1, seed=12)[0]
    free = generate_ids(hf_model, prompt, max_new_tokens=24)
    word = free[4:6]
    seq = Sequence(prompt, SamplingParams(max_tokens=24, stop_words=[[4000, 4001], word]))
    run(make_engine(tiny_model_dir), [seq])
    cut = next(i + 2 for i in range(len(free) - 1) if free[i : i + 2] == word)
    assert seq.finish_reason is FinishReason.STOP_WORDS
    assert seq.output_ids == free[:cut]


def test_log_probs_and_logits_are_the_models_own(tiny_model_dir, hf_model):
    prompt = random_prompts(1, seed=13)[0]
    params = SamplingParams(
        max_tokens=8,
        repetition_penalty=1.5,  # processing must not leak into the reported numbers
        return_log_probs=True,
        top_log_probs=3,
        return_context_logits=True,
        return_generation_logits=True,
    )
    seq = Sequence(prompt, params)
    run(make_engine(tiny_model_dir, max_num_batched_tokens=16), [seq])  # prompt split over chunks
    ref = hf_model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=8,
        repetition_penalty=1.5,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert seq.output_ids == ref.sequences[0, len(prompt) :].tolist()
    raw = torch.cat(ref.logits)  # [tokens, vocab], before processing
    assert torch.allclose(torch.stack(seq.recorded.generation_logits), raw, atol=1e-4)
    logprobs = torch.log_softmax(raw, -1)
    expected = logprobs[torch.arange(8), torch.tensor(seq.output_ids)]
    assert torch.allclose(torch.tensor(seq.recorded.logprobs), expected, atol=1e-4)
    top = torch.topk(logprobs, 3)
    assert [ids for ids, _ in seq.recorded.top_logprobs] == top.indices.tolist()
    with torch.no_grad():
        context = hf_model(torch.tensor([prompt])).logits[0]
    assert torch.allclose(torch.stack(seq.recorded.context_logits), context, atol=1e-4)


def test_prompt_log_probs_are_the_models_own_even_from_a_cached_prefix(tiny_model_dir, hf_model):
    prompt = random_prompts(1, seed=14, max_len=60)[0] + [7] * 40
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=16)  # the prompt is split over chunks
    run(engine, [Sequence(prompt, SamplingParams(max_tokens=1))])  # now its blocks are in the prefix cache
    params = SamplingParams(max_tokens=1, return_prompt_log_probs=True, top_log_probs=2, return_context_logits=True)
    seq = Sequence(prompt, params)
    run(engine, [seq])
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt])).logits[0]
    logprobs = torch.log_softmax(logits[:-1], -1)
    expected = logprobs[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    assert torch.allclose(torch.tensor(seq.recorded.prompt_logprobs), expected, atol=1e-4)
    assert [ids for ids, _ in seq.recorded.prompt_top_logprobs] == torch.topk(logprobs, 2).indices.tolist()
    assert torch.allclose(torch.stack(seq.recorded.context_logits), logits, atol=1e-4)  # every row, none from the cache
