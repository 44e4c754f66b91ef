"""The step-cost line learned from the steps, and the prefill cap it sets while streams decode."""

from __future__ import annotations

import pytest

from tritonllm.engine.scheduling.step_cost import StepCost
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

from .test_engine import make_engine


def fitted(fixed: float = 0.1, per_token: float = 0.002, sizes=(1, 8, 40, 120, 8, 300, 16, 64, 8, 200)) -> StepCost:
    cost = StepCost()
    for tokens in sizes:
        cost.observe(tokens, fixed + per_token * tokens)
    return cost


def test_the_line_through_the_steps_sets_the_prefill_cap():
    cost = fitted()
    # a step of 8 decodes takes 0.116 s; 2x that leaves 0.116 s for prefill: 58 tokens
    assert cost.prefill_allowance(8) == 58
    assert StepCost(slowdown=3.0, _line=cost._line).prefill_allowance(8) == 116


def test_no_cap_without_decodes_or_before_the_line_is_known():
    assert fitted().prefill_allowance(0) is None
    assert StepCost().prefill_allowance(8) is None
    assert StepCost(slowdown=0, _line=(0.1, 0.002)).prefill_allowance(8) is None


def test_steady_decoding_keeps_the_line_learned_before():
    cost = fitted()
    for i in range(500):  # every step alike but for noise: no line can be told from them
        cost.observe(8, 0.116 * (1 + 0.01 * (-1) ** i))
    assert cost.prefill_allowance(8) in range(55, 62)


def test_a_slow_step_still_lets_a_prompt_advance():
    cost = fitted(fixed=0.001, per_token=0.01)
    assert cost.prefill_allowance(1) == cost.min_prefill


@pytest.mark.parametrize("allowance", [8, 24])
def test_a_step_with_decodes_takes_no_more_prefill_than_allowed(tiny_model_dir, allowance):
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=256)
    decoding = [Sequence([5 + i, 6, 7], SamplingParams(max_tokens=50)) for i in range(4)]
    for seq in decoding:
        engine.add(seq)
    engine.step()  # their prefills; they decode from now on
    engine.step_cost = engine.scheduler.step_cost = StepCost(_line=(1.0, 1.0), min_prefill=1)
    engine.scheduler.step_cost.slowdown = 1.0 + allowance / (1.0 + len(decoding))
    long = Sequence(list(range(10, 110)), SamplingParams(max_tokens=4))
    long.timing.arrival_time += engine.scheduler.burst_seconds  # it comes after the streams began, not with them
    engine.add(long)
    while long.num_computed < len(long.prompt_ids):
        before = long.num_computed
        engine.step()
        assert all(s.num_output_tokens > 0 for s in decoding)
        assert long.num_computed - before <= allowance
    assert long.num_computed == 100


def test_a_burst_goes_in_at_the_full_budget_and_a_prompt_that_comes_later_is_capped(tiny_model_dir):
    """The cap protects streams from prompts that arrive while they stream; a burst's prompts come together, so
    they go in at the step's full budget (its last first token is not held back by the streams its first prompts
    started), and a prompt that comes well after them is capped."""
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=64)
    engine.scheduler.step_cost.prefill_allowance = lambda decodes: 4
    burst = [Sequence(list(range(10 + i, 40 + i)), SamplingParams(max_tokens=50)) for i in range(6)]
    for seq in burst:
        engine.add(seq)

    def prompt_progress(seqs):
        return sum(min(s.num_computed, s.num_prompt_tokens) for s in seqs)

    steps_with_decodes = 0
    while prompt_progress(burst) < sum(s.num_prompt_tokens for s in burst):
        before, decodes = prompt_progress(burst), sum(s.num_output_tokens > 0 for s in burst)
        engine.step()
        steps_with_decodes += decodes > 0
        assert prompt_progress(burst) - before > 4, "a burst's prompt held to the cap"
    assert steps_with_decodes >= 2  # its first streams decoded while the rest went in
    late = Sequence(list(range(100, 140)), SamplingParams(max_tokens=4))
    late.timing.arrival_time += engine.scheduler.burst_seconds
    engine.add(late)
    engine.step()
    assert all(s.num_output_tokens > 1 for s in burst)
    assert 0 < late.num_computed <= 4
