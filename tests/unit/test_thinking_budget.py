"""A reasoning model's thinking held to a budget (tritonllm/engine/thinking_budget.py): once spent, the closing
tag is forced and the answer follows; against transformers' greedy generate() on the prefix the budget forced."""

from __future__ import annotations

import pytest
from oracles import greedy_ids

from tritonllm.engine.sampling_params import SamplingParams
from tritonllm.engine.sequence import Sequence
from tritonllm.engine.thinking_budget import ThinkingBudget, ThinkingTracker

from .test_engine import make_engine, random_prompts, run

END = (201, 202, 203)  # a closing tag of three tokens


def forced_along(budget: ThinkingBudget, output: list[int]) -> list[int | None]:
    """What the tracker forces before each token of `output`."""
    tracker, forced = ThinkingTracker(budget), []
    for token in output:
        forced.append(tracker.forced())
        tracker.advance(token)
    return forced


def test_the_closing_tag_is_forced_once_the_budget_is_spent_and_never_again():
    inside = ThinkingBudget(2, (), END)
    assert forced_along(inside, [5, 6, *END, 7, 8]) == [None, None, *END, None, None]
    opened_later = ThinkingBudget(1, (100, 101), END)
    assert forced_along(opened_later, [9, 100, 101, 5, *END, 7]) == [None, None, None, None, *END, None]
    closed_in_time = ThinkingBudget(5, (), END)
    assert forced_along(closed_in_time, [5, *END, 6, 7, 8, 9, 10]) == [None] * 9
    never_opened = ThinkingBudget(0, (100,), END)
    assert forced_along(never_opened, [5, 6, 7]) == [None] * 3
    zero = ThinkingBudget(0, (), END)
    assert forced_along(zero, [*END, 5]) == [*END, None]


def continued(hf_model, prompt: list[int], forced_prefix: list[int], total: int) -> list[int]:
    """The greedy output once `forced_prefix` is in: the prefix, then generate()'s continuation."""
    return forced_prefix + greedy_ids(hf_model, prompt + forced_prefix, total - len(forced_prefix))


@pytest.mark.parametrize("speculative", ["", "ngram"])
def test_greedy_output_is_generates_around_the_forced_tag(tiny_model_dir, hf_model, speculative):
    engine = make_engine(tiny_model_dir, speculative=speculative or "none")
    prompts = random_prompts(3, seed=11)
    free = [greedy_ids(hf_model, p, 16) for p in prompts]
    cases = [
        # the prompt opened the block: 3 tokens of thinking, then the tag
        (ThinkingBudget(3, (), END), lambda f: f[:3] + list(END)),
        # the model opens it with its first two tokens: 2 more of thinking, then the tag
        (lambda f: ThinkingBudget(2, tuple(f[:2]), END), lambda f: f[:4] + list(END)),
        # the model closes it within the budget itself: nothing is forced
        (lambda f: ThinkingBudget(8, (), tuple(f[2:4])), lambda f: []),
    ]
    for make_budget, forced_prefix in cases:
        seqs = []
        for prompt, f in zip(prompts, free, strict=True):
            budget = make_budget(f) if callable(make_budget) else make_budget
            seqs.append(Sequence(prompt, SamplingParams(max_tokens=16, thinking_budget=budget)))
        run(engine, seqs)
        for prompt, f, seq in zip(prompts, free, seqs, strict=True):
            expected = continued(hf_model, prompt, forced_prefix(f), 16) if forced_prefix(f) else f
            assert seq.output_ids == expected
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_a_sampled_answer_gets_the_tag_at_the_budget(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    seqs = [
        Sequence(p, SamplingParams(max_tokens=10, temperature=1.0, seed=i, thinking_budget=ThinkingBudget(4, (), END)))
        for i, p in enumerate(random_prompts(4, seed=12))
    ]
    run(engine, seqs)
    for seq in seqs:
        assert tuple(seq.output_ids[4:7]) == END
