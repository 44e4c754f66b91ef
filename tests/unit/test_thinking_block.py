"""A reasoning model's thinking block followed (tritonllm/engine/state/thinking_block.py): once its budget is spent the
closing tag is forced and the answer follows (against transformers' greedy generate() on the prefix the budget
forced), and a grammar holds the answer only."""

from __future__ import annotations

import re

import pytest
from oracles import greedy_ids

from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.engine.state.thinking_block import ThinkingBlock, ThinkingTracker

from .test_engine import make_engine, random_prompts, run

END = (201, 202, 203)  # a closing tag of three tokens


def forced_along(budget: ThinkingBlock, output: list[int]) -> list[int | None]:
    """What the tracker forces before each token of `output`."""
    tracker, forced = ThinkingTracker(budget), []
    for token in output:
        forced.append(tracker.forced())
        tracker.advance(token)
    return forced


def test_the_closing_tag_is_forced_once_the_budget_is_spent_and_never_again():
    inside = ThinkingBlock(2, (), END)
    assert forced_along(inside, [5, 6, *END, 7, 8]) == [None, None, *END, None, None]
    opened_first = ThinkingBlock(1, (100, 101), END)
    assert forced_along(opened_first, [100, 101, 5, *END, 7]) == [None, None, None, *END, None]
    not_opened_first = ThinkingBlock(0, (100, 101), END)  # the block opens with the answer's first tokens or never
    assert forced_along(not_opened_first, [9, 100, 101, 5, 6]) == [None] * 5
    closed_in_time = ThinkingBlock(5, (), END)
    assert forced_along(closed_in_time, [5, *END, 6, 7, 8, 9, 10]) == [None] * 9
    zero = ThinkingBlock(0, (), END)
    assert forced_along(zero, [*END, 5]) == [*END, None]
    followed_only = ThinkingBlock(None, (), END)
    assert forced_along(followed_only, [5] * 50) == [None] * 50


def test_the_answer_starts_where_the_block_closes_or_was_never_opened():
    def answering_along(budget: ThinkingBlock, output: list[int]) -> list[bool]:
        tracker, answering = ThinkingTracker(budget), []
        for token in output:
            answering.append(tracker.answering)
            tracker.advance(token)
        return answering

    assert answering_along(ThinkingBlock(None, (), END), [5, *END, 6]) == [False] * 4 + [True]
    assert answering_along(ThinkingBlock(None, (100,), END), [100, 5, *END, 6]) == [False] * 5 + [True]
    assert answering_along(ThinkingBlock(None, (100,), END), [7, 8]) == [False, True]


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
        (ThinkingBlock(3, (), END), lambda f: f[:3] + list(END)),
        # the model opens it with its first two tokens: 2 more of thinking, then the tag
        (lambda f: ThinkingBlock(2, tuple(f[:2]), END), lambda f: f[:4] + list(END)),
        # the model closes it within the budget itself: nothing is forced
        (lambda f: ThinkingBlock(8, (), tuple(f[2:4])), lambda f: []),
    ]
    for make_budget, forced_prefix in cases:
        seqs = []
        for prompt, f in zip(prompts, free, strict=True):
            budget = make_budget(f) if callable(make_budget) else make_budget
            seqs.append(Sequence(prompt, SamplingParams(max_tokens=16, thinking=budget)))
        run(engine, seqs)
        for prompt, f, seq in zip(prompts, free, seqs, strict=True):
            expected = continued(hf_model, prompt, forced_prefix(f), 16) if forced_prefix(f) else f
            assert seq.output_ids == expected
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_a_sampled_answer_gets_the_tag_at_the_budget(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    seqs = [
        Sequence(p, SamplingParams(max_tokens=10, temperature=1.0, seed=i, thinking=ThinkingBlock(4, (), END)))
        for i, p in enumerate(random_prompts(4, seed=12))
    ]
    run(engine, seqs)
    for seq in seqs:
        assert tuple(seq.output_ids[4:7]) == END


def test_a_grammar_constrains_the_answer_after_the_thinking(tiny_model_dir, hf_model, tokenizer):
    """With the prompt opening the block and a budget of 3: three free tokens, the tag, then the grammar's answer,
    the same as the engine gives the prompt with those tokens and the tag appended, under the grammar from the
    start."""
    from tritonllm.engine.decoding.grammar import GrammarCompiler

    compiler = GrammarCompiler(tokenizer)
    regex = r"[a-z]{2,6}!"
    engine = make_engine(tiny_model_dir)
    prompts = random_prompts(2, seed=13)
    free = [greedy_ids(hf_model, p, 3) for p in prompts]
    thinking, plain = [], []
    for prompt, f in zip(prompts, free, strict=True):
        seq = Sequence(prompt, SamplingParams(max_tokens=20, thinking=ThinkingBlock(3, (), END)))
        seq.grammar = compiler.matcher("regex", regex)
        ref = Sequence(prompt + f + list(END), SamplingParams(max_tokens=17))
        ref.grammar = compiler.matcher("regex", regex)
        thinking.append(seq)
        plain.append(ref)
    run(engine, thinking + plain)
    for f, seq, ref in zip(free, thinking, plain, strict=True):
        assert seq.output_ids[:6] == f + list(END)  # free thinking: what generate() says, then the forced tag
        assert seq.output_ids[6:] == ref.output_ids
        assert re.fullmatch(regex, tokenizer.decode(ref.output_ids, skip_special_tokens=True))


def test_an_answer_that_does_not_open_the_block_is_the_grammars_from_its_first_token(tiny_model_dir, tokenizer):
    import torch

    from tritonllm.engine.decoding.grammar import GrammarCompiler

    compiler = GrammarCompiler(tokenizer)
    start = 300
    never_start = torch.zeros(len(tokenizer))
    never_start[start] = -100.0  # the model never opens the block
    engine = make_engine(tiny_model_dir)
    seqs = []
    for prompt in random_prompts(3, seed=14):
        params = SamplingParams(max_tokens=12, embedding_bias=never_start, thinking=ThinkingBlock(None, (start,), END))
        seqs.append(Sequence(prompt, params))
        seqs[-1].grammar = compiler.matcher("regex", r"[a-z]{2}!")
    run(engine, seqs)
    for seq in seqs:
        assert re.fullmatch(r"[a-z]{2}!", tokenizer.decode(seq.output_ids, skip_special_tokens=True))
