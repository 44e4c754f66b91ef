"""Scheduling under load: prefix sharing, priorities, deadlines, the queue limit."""

from __future__ import annotations

import time

import pytest

from tritonllm.engine.engine_thread import EngineThread, FinishRate, Overloaded, Submission
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import FinishReason, Sequence, samples_of

from .test_engine import make_engine, random_prompts, run

SHARED = list(range(100, 140))  # 40 tokens: 10 blocks of 4


def test_requests_sharing_a_prefix_share_its_blocks_without_changing_outputs(tiny_model_dir):
    tails = [[7, 8, 9], [10, 11], [12, 13, 14, 15, 16]]

    def outputs(prefix_caching: bool):
        engine = make_engine(tiny_model_dir, enable_prefix_caching=prefix_caching)
        seqs = [Sequence(SHARED + tail, SamplingParams(max_tokens=12)) for tail in tails]
        run(engine, seqs[:1])  # the first one fills and names the shared blocks
        run(engine, seqs[1:])
        assert engine.blocks.num_free == engine.blocks.num_blocks
        return [s.output_ids for s in seqs], engine.blocks.prefix_hit_tokens

    cached, hits = outputs(True)
    uncached, no_hits = outputs(False)
    assert cached == uncached
    assert no_hits == 0 and hits == 2 * len(SHARED)


def test_running_sequences_share_blocks_with_later_arrivals(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    first = Sequence(SHARED + [1], SamplingParams(max_tokens=30))
    engine.add(first)
    engine.step()  # the prefill registers the full blocks
    used_by_one = engine.blocks.num_used
    second = Sequence(SHARED + [2], SamplingParams(max_tokens=30))
    engine.add(second)
    engine.step()
    assert engine.blocks.prefix_hit_tokens == len(SHARED)
    assert engine.blocks.num_used <= used_by_one + 2  # only its own last block(s)
    assert second.block_table[:10] == first.block_table[:10]


def test_a_preempted_sequence_resumes_from_the_cache(tiny_model_dir):
    engine = make_engine(tiny_model_dir, num_kv_blocks=40)
    seqs = [Sequence(p, SamplingParams(max_tokens=30)) for p in random_prompts(8, seed=3, max_len=30)]
    run(engine, seqs)
    assert engine.scheduler.num_preemptions > 0
    assert engine.blocks.prefix_hit_tokens > 0


def test_higher_priority_preempts_a_full_batch(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_num_seqs=1)
    low = Sequence([5, 6, 7], SamplingParams(max_tokens=20), priority=5)
    high = Sequence([8, 9, 10], SamplingParams(max_tokens=5), priority=1)
    engine.add(low)
    engine.step()
    engine.add(high)
    finished = []
    while engine.has_work():
        finished += [o.seq for o in engine.step() if o.finished]
    assert finished == [high, low]
    assert engine.scheduler.num_preemptions == 1
    assert low.num_output_tokens == 20


def test_waiting_requests_are_admitted_by_priority_then_arrival(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_num_seqs=1)
    blocker = Sequence([1, 2], SamplingParams(max_tokens=3), priority=1)
    engine.add(blocker)
    engine.step()
    order = [
        Sequence([3], SamplingParams(max_tokens=1), priority=p) for p in (5, 3, 1, 3)
    ]  # arrival order: 5, 3a, 1, 3b
    for seq in order:
        engine.add(seq)
    finished = []
    while engine.has_work():
        finished += [o.seq for o in engine.step() if o.finished and o.seq is not blocker]
    assert [s.priority for s in finished] == [1, 3, 3, 5]
    assert finished[1] is order[1] and finished[2] is order[3]


def test_an_expired_request_ends_with_timeout_and_frees_its_blocks(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    late = Sequence([5, 6, 7], SamplingParams(max_tokens=500), deadline=time.monotonic() + 600)
    on_time = Sequence([5, 6, 8], SamplingParams(max_tokens=10), deadline=time.monotonic() + 600)
    engine.add(late)
    for _ in range(3):
        engine.step()
    # its deadline passes mid-generation, whatever the machine's speed (a 0.2 s deadline did not, on a fast one)
    late.deadline = time.monotonic()
    run(engine, [on_time])
    assert late.finish_reason is FinishReason.TIMEOUT and 0 < late.num_output_tokens < 500
    assert on_time.finish_reason is FinishReason.LENGTH
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_a_full_queue_rejects_at_once_and_a_request_all_or_nothing(tiny_model_dir):
    thread = EngineThread(make_engine(tiny_model_dir), max_queue_size=3)  # not started: nothing is taken in

    def request(samples: int) -> list[Submission]:
        return [Submission(Sequence([1], SamplingParams()), lambda out: None) for _ in range(samples)]

    thread.submit(request(2))
    with pytest.raises(Overloaded, match="max_queue_size=3"):
        thread.submit(request(2))  # would overflow: none of its samples goes in
    assert thread.num_queued() == 2
    thread.submit(request(1))
    with pytest.raises(Overloaded):
        thread.submit(request(1))


def test_a_request_that_would_wait_too_long_is_shed_unless_nothing_of_its_rank_is_ahead(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    thread = EngineThread(engine, max_queue_wait=1.0)  # not started: what is submitted stays queued

    def request(priority: int = 5) -> list[Submission]:
        return [Submission(Sequence([1], SamplingParams(), priority=priority), lambda out: None)]

    thread.submit(request())
    thread.submit(request())  # no finish seen yet: no rate to judge a wait by
    now = time.monotonic()
    for at in (now - 2.0, now - 1.0, now):  # finishes 1 s apart: 1 a second
        thread.finishes.record(at)
    with pytest.raises(Overloaded, match="max_queue_wait=1 s") as shed:
        thread.submit(request())  # 2 ahead, 2 s at 1 a second
    assert shed.value.retry_after_s == 1 and shed.value.param == "max_queue_wait"
    thread.submit(request(priority=1))  # nothing of its rank ahead of it
    assert thread.num_queued() == 3


def test_the_finish_rate_forgets_an_idle_spell():
    rate = FinishRate(horizon_s=30.0)
    for at in (0.0, 0.5, 1.0):
        rate.record(at)
    assert rate.per_second(now=2.0) == 2.0
    assert rate.per_second(now=100.0) is None  # a burst after a quiet minute is not judged by the old pace


def test_samples_share_the_prompt_blocks_and_draw_from_their_own_seeds(tiny_model_dir):
    prompt = SHARED + [7, 8]  # 42 tokens: 10 full blocks of 4 to share
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=40)
    engine = make_engine(tiny_model_dir)
    samples = samples_of(prompt, params, 4)
    run(engine, samples)
    assert [s.sample_index for s in samples] == [0, 1, 2, 3]
    assert engine.blocks.prefix_hit_tokens == 3 * 40
    assert len({tuple(s.output_ids) for s in samples}) == 4
    for i, sample in enumerate(samples):  # each equals a lone request with seed 40 + i
        alone = Sequence(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=40 + i))
        run(make_engine(tiny_model_dir), [alone])
        assert sample.output_ids == alone.output_ids
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_samples_wait_for_the_first_to_compute_the_prompt(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=16)  # the 42-token prompt takes 3 steps
    samples = samples_of(SHARED + [7, 8], SamplingParams(max_tokens=4), 3)
    for seq in samples:
        engine.add(seq)
    engine.step()
    assert [s.status.value for s in samples] == ["running", "waiting", "waiting"]
    run(engine, [])
    assert all(s.output_ids == samples[0].output_ids for s in samples)  # greedy samples agree
