"""Pacing of streamed responses: every token exactly once, in order; the first and the last never wait."""

from __future__ import annotations

import pytest

from tritonllm.backend.stream_interval import StreamInterval


def responses(interval: int, steps: list[int]) -> list[list[int]]:
    """The token positions each response carries when the engine yields `steps[i]` tokens at step i."""
    pacing, done, sent = StreamInterval(interval), 0, []
    for i, new in enumerate(steps):
        done += new
        span = pacing.take(done, finished=i == len(steps) - 1)
        if span is not None:
            sent.append(list(range(done))[span])
    return sent


def test_interval_one_sends_each_token_as_it_comes():
    assert responses(1, [1, 1, 1, 1]) == [[0], [1], [2], [3]]


def test_interval_two_sends_the_first_token_at_once_then_pairs_and_the_rest_at_the_end():
    assert responses(2, [1] * 6) == [[0], [1, 2], [3, 4], [5]]


def test_several_tokens_of_one_step_go_out_together():
    # draft tokens: a step may accept several at once
    assert responses(3, [1, 1, 3, 1, 1]) == [[0], [1, 2, 3, 4], [5, 6]]


@pytest.mark.parametrize("interval", [1, 2, 3, 5])
def test_every_token_goes_out_exactly_once_in_order(interval):
    steps = [1, 2, 1, 1, 4, 1, 1, 1]
    assert [t for r in responses(interval, steps) for t in r] == list(range(sum(steps)))


def test_a_sequence_that_ends_without_a_new_token_flushes_what_waits():
    pacing = StreamInterval(4)
    assert pacing.take(1, finished=False) == slice(0, 1)
    assert pacing.take(3, finished=False) is None
    assert pacing.take(3, finished=True) == slice(1, 3)  # cancelled between steps


def test_an_interval_below_one_is_refused():
    with pytest.raises(ValueError, match="stream_interval"):
        StreamInterval(0)
