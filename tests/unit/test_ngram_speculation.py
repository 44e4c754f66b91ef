"""Speculative decoding with n-gram drafts (engine/speculation/ngram_drafter.py): greedy output equal to generate() with
drafts accepted, in fewer steps; the lookup equal to a plain scan; seeded sampling still independent of the
batch; no block left behind."""

from __future__ import annotations

import random

import pytest
import torch
from oracles import greedy_ids

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.scheduling.scheduler import Scheduler
from tritonllm.engine.speculation.ngram_drafter import DORMANT_TOKENS, NgramDrafter, NgramIndex
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence, Speculation

from .test_engine import make_engine, random_prompts, reference, run


def scanned(tokens: list[int], sizes: range, limit: int) -> list[int]:
    """The drafter's rule by brute force: the longest n whose last occurrence before the end has a follower."""
    for n in reversed(sizes):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if len(tokens) > n and tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + limit]
    return []


def test_lookup_takes_the_longest_then_latest_match():
    index = NgramIndex(range(2, 5))
    tokens = [5, 6, 7, 5, 6, 8, 1, 2, 3, 4, 9, 1, 2, 3]
    index.update(tokens)
    assert index.continuation(tokens, 4) == [4, 9, 1, 2]  # (1, 2, 3) beats the later (2, 3)... and (5, 6)
    tokens = [5, 6, 7, 5, 6, 8, 5, 6]
    index = NgramIndex(range(2, 5))
    index.update(tokens)
    assert index.continuation(tokens, 3) == [8, 5, 6]  # (5, 6) last seen before 8
    index = NgramIndex(range(2, 5))
    index.update([1, 2, 3, 4])
    assert index.continuation([1, 2, 3, 4], 4) == []


def test_growing_index_equals_a_scan_of_every_prefix():
    rng = random.Random(0)
    tokens = [rng.randrange(6) for _ in range(400)]
    index = NgramIndex(range(1, 4))
    for length in range(20, len(tokens)):
        index.update(tokens[:length])
        assert index.continuation(tokens[:length], 5) == scanned(tokens[:length], range(1, 4), 5), length


def test_drafts_only_as_many_tokens_as_their_acceptance_pays_for():
    drafter = NgramDrafter(num_tokens=4, min_n=1, max_n=2)
    seq = Sequence([1, 2, 3, 4, 5, 6, 7, 8] * 4, SamplingParams())
    assert len(drafter.draft(seq, room=8)) == 1  # prior: kept half the time, a row costs a quarter of a step
    assert drafter.draft(seq, room=8, row_share=2.0) == []  # a row dearer than a step: never worth it
    for _ in range(4):
        drafter.verified(seq, drafted=4, accepted=4)
    assert drafter.draft(seq, room=8) == [1, 2, 3, 4]
    assert drafter.draft(seq, room=2) == [1, 2]
    for _ in range(12):  # the text stopped repeating itself
        drafter.verified(seq, drafted=1, accepted=0)
    assert drafter.draft(seq, room=8) == []
    seq.token_ids += [1, 2, 3, 4, 5, 6, 7, 8] * (DORMANT_TOKENS // 8) + [1]
    assert drafter.draft(seq, room=8) == [2]  # dormant long enough: one draft tries again
    assert drafter.draft(seq, room=8) == []


def repetitive_prompts() -> list[list[int]]:
    """Prompts that repeat a phrase, as code being edited or a quoted source does."""
    return [(phrase * 3)[:60] for phrase in random_prompts(4, seed=71, max_len=20)]


LOOPING = [11, 22, 33, 44]  # tokens biased so that the random tiny model's greedy output repeats itself


def looping_params(max_tokens: int, **more) -> SamplingParams:
    bias = torch.zeros(4096)
    bias[LOOPING] = 8.0
    return SamplingParams(max_tokens=max_tokens, embedding_bias=bias, **more)


def looping_reference(hf_model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = hf_model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        sequence_bias={(t,): 8.0 for t in LOOPING},
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("max_num_batched_tokens", [64, 9])  # 9: drafts cut to fit the step's budget
def test_greedy_with_ngram_drafts_equals_generate(tiny_model_dir, hf_model, max_num_batched_tokens):
    prompts = repetitive_prompts()
    engine = make_engine(
        tiny_model_dir, speculative="ngram", prompt_lookup_min=1, max_num_batched_tokens=max_num_batched_tokens
    )
    engine.step_cost.token_share = lambda tokens: 0.1  # how many drafts pay, not the machine's step times
    plain = [Sequence(p, SamplingParams(max_tokens=24)) for p in prompts]
    looping = [Sequence(p, looping_params(24)) for p in prompts]
    run(engine, [*plain, *looping], arrive_every=2)
    for seq, prompt in zip(plain, prompts, strict=True):
        assert seq.output_ids == reference(hf_model, prompt, 24)
    for seq, prompt in zip(looping, prompts, strict=True):
        assert seq.output_ids == looping_reference(hf_model, prompt, 24)
    stats = engine.stats
    assert stats.draft_tokens > stats.accepted_draft_tokens > 0  # some drafts kept, some not
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_drafts_stop_at_max_tokens_and_stop_words(tiny_model_dir, hf_model):
    prompt = repetitive_prompts()[0]
    free = looping_reference(hf_model, prompt, 30)
    engine = make_engine(tiny_model_dir, speculative="ngram", num_speculative_tokens=6, prompt_lookup_min=1)
    engine.step_cost.token_share = lambda tokens: 0.01  # drafts all but free: some reach past the ends
    short = Sequence(prompt, looping_params(7))
    stopped = Sequence(prompt, looping_params(30, stop_words=[free[20:22]]))
    run(engine, [short, stopped])
    assert short.output_ids == free[:7]
    assert stopped.output_ids == free[: 22 + next(i for i in range(20) if free[i : i + 2] == free[20:22]) - 20]
    assert engine.stats.accepted_draft_tokens > 0


CODE = (
    "def area(width, height):\n    return width * height\n\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n"
)


def test_a_real_model_editing_code_takes_fewer_steps_for_the_same_tokens(smollm2_gguf):
    import transformers

    from tritonllm.formats import gguf

    model_dir = gguf.hf_model_dir(smollm2_gguf)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    ask = [{"role": "user", "content": "Add a docstring to each function in this code:\n" + CODE}]
    prompt = list(tokenizer.apply_chat_template(ask, add_generation_prompt=True, return_dict=True)["input_ids"])

    def decode(speculative: str) -> tuple[list[int], LLMEngine]:
        engine = LLMEngine(
            EngineConfig(str(model_dir), num_kv_blocks=64, gguf_file=str(smollm2_gguf), speculative=speculative)
        )
        engine.step_cost.token_share = lambda tokens: 0.1  # the measured step times would make the count vary
        seq = Sequence(prompt, SamplingParams(max_tokens=48))
        run(engine, [seq])
        return seq.output_ids, engine

    drafted, engine = decode("ngram")
    plain, plain_engine = decode("none")
    file = smollm2_gguf  # served from its blocks; generate() on the file dequantized
    hf = transformers.AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name).eval()
    assert drafted == plain == greedy_ids(hf, prompt, 48)
    assert engine.stats.accepted_draft_tokens >= 12
    assert engine.stats.steps <= plain_engine.stats.steps - 12


def test_seeded_sampling_with_drafts_does_not_depend_on_the_batch(tiny_model_dir):
    prompt = repetitive_prompts()[1]
    params = looping_params(32, temperature=0.3, seed=5)

    def engine(**settings):
        return make_engine(tiny_model_dir, speculative="ngram", prompt_lookup_min=1, **settings)

    alone = Sequence(prompt, params)
    first = engine()
    run(first, [alone])
    crowd = [Sequence(p, looping_params(32, temperature=1.0, seed=i)) for i, p in enumerate(random_prompts(9, 6))]
    together = Sequence(prompt, params)
    run(engine(max_num_batched_tokens=12), [*crowd[:4], together, *crowd[4:]])  # drafts wait for room
    assert first.stats.draft_tokens > 0  # verified drafts, kept or not, take their own random draws
    assert together.output_ids == alone.output_ids


def test_requests_with_their_own_drafts_are_not_drafted_for(tiny_model_dir, hf_model):
    prompt = repetitive_prompts()[2]
    free = reference(hf_model, prompt, 12)
    engine = make_engine(tiny_model_dir, speculative="ngram", prompt_lookup_min=1)
    own = Sequence(prompt, SamplingParams(max_tokens=12), speculation=Speculation(free[:2]))
    run(engine, [own])
    assert own.output_ids == free
    assert own.speculation.accepted_drafts == 2  # what the request is told: its own drafts, not the engine's later ones
    assert engine.stats.verifications == 1


def test_a_sampled_sequence_waits_for_room_for_its_drafts_where_a_greedy_one_cuts_them():
    def decoding_with_drafts(params: SamplingParams) -> Sequence:
        seq = Sequence([1, 2, 3], params)
        seq.num_computed, seq.speculation.draft_tokens = 2, [4, 5, 6]
        return seq

    assert Scheduler._plan(decoding_with_drafts(SamplingParams()), 2, budget=3).drafts == [4, 5]
    # a sampled sequence's draws depend on its drafts: cut by the batch's budget, they would depend on the batch
    assert Scheduler._plan(decoding_with_drafts(SamplingParams(temperature=1.0)), 2, budget=3) is None


def test_a_prediction_is_drafted_from_while_the_output_follows_it_and_after_it_rejoins():
    drafter = NgramDrafter(num_tokens=4, min_n=2, max_n=3)
    prediction = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    seq = Sequence([1, 2, 3], SamplingParams(), speculation=Speculation(prediction=prediction))
    seq.token_ids += [10]
    cheap = 0.1  # one more row's share of a step
    assert drafter.draft(seq, room=8, row_share=cheap) == [11, 12, 13, 14]  # a prediction is trusted from the start
    seq.token_ids += [11, 12, 99]  # an edit
    assert drafter.draft(seq, room=8, row_share=cheap) == []  # (12, 99) is in no prediction
    seq.token_ids += [14, 15]  # back on the prediction's text
    assert drafter.draft(seq, room=8, row_share=cheap) == [16, 17, 18, 19]


@pytest.mark.parametrize("edit", [False, True])
def test_greedy_with_a_prediction_equals_generate_in_fewer_steps(tiny_model_dir, hf_model, edit):
    prompt = random_prompts(1, seed=72)[0]
    expected = reference(hf_model, prompt, 40)
    prediction = list(expected)
    if edit:  # a token changed in the middle: drafts stop there, and pick up after it
        prediction[20] = (prediction[20] + 1) % 4096
    engine = make_engine(tiny_model_dir)  # speculative=none: a prediction is drafted from all the same
    seq = Sequence(prompt, SamplingParams(max_tokens=40), speculation=Speculation(prediction=prediction))
    steps = run(engine, [seq])
    assert seq.output_ids == expected
    assert seq.speculation.accepted_prediction_tokens >= (22 if edit else 28), (
        seq.speculation.accepted_prediction_tokens
    )
    assert seq.rejected_prediction_tokens == 40 - seq.speculation.accepted_prediction_tokens
    assert steps <= 20, steps
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_a_wrong_prediction_changes_nothing_but_the_counts(tiny_model_dir, hf_model):
    prompt = random_prompts(1, seed=73)[0]
    seq = Sequence(prompt, SamplingParams(max_tokens=24), speculation=Speculation(prediction=list(range(100, 140))))
    run(make_engine(tiny_model_dir), [seq])
    assert seq.output_ids == reference(hf_model, prompt, 24)
    assert seq.speculation.accepted_prediction_tokens == 0 and seq.rejected_prediction_tokens == 40
