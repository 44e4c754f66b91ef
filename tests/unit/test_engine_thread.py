"""The background engine thread: callbacks, cancellation by request id and by probe, blocks returned."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.engine_thread import EngineThread, Submission, load_on_own_thread
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import FinishReason, Sequence


class Collector:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.reason: FinishReason | None = None
        self.done = threading.Event()
        self.first = threading.Event()

    def __call__(self, out) -> None:
        self.tokens += out.new_token_ids
        self.first.set()
        if out.finished:
            self.reason = out.seq.finish_reason
            self.done.set()


def test_thread_streams_cancels_and_frees_blocks(tiny_model_dir):
    engine = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=256, block_size=8))
    thread = EngineThread(engine)
    thread.start()
    try:
        finished, by_id, by_probe = Collector(), Collector(), Collector()
        probe = threading.Event()
        thread.submit([Submission(Sequence([5, 6, 7], SamplingParams(max_tokens=8), request_id="a"), finished)])
        thread.submit([Submission(Sequence([5, 6, 7], SamplingParams(max_tokens=1500), request_id="b"), by_id)])
        thread.submit(
            [Submission(Sequence([8, 9], SamplingParams(max_tokens=1500), request_id="c"), by_probe, probe.is_set)]
        )
        assert by_id.first.wait(30) and by_probe.first.wait(30)
        thread.cancel("b")
        probe.set()
        for c in (finished, by_id, by_probe):
            assert c.done.wait(30)
        assert finished.reason is FinishReason.LENGTH and len(finished.tokens) == 8
        assert by_id.reason is FinishReason.CANCELLED and len(by_id.tokens) < 1500
        assert by_probe.reason is FinishReason.CANCELLED and len(by_probe.tokens) < 1500
    finally:
        thread.shutdown()
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_a_sequence_the_engine_cannot_admit_ends_with_error(tiny_model_dir):
    engine = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=16, block_size=8))
    thread = EngineThread(engine)
    thread.start()
    try:
        bad = Collector()
        thread.submit([Submission(Sequence([], SamplingParams(max_tokens=4)), bad)])
        assert bad.done.wait(30)
        assert bad.reason is FinishReason.ERROR
    finally:
        thread.shutdown()


def test_the_thread_survives_a_broken_submission(tiny_model_dir):
    engine = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=16, block_size=8))
    thread = EngineThread(engine)
    thread.start()
    try:
        thread.submit([object()])  # not a Submission: handling it raises inside the engine thread
        good = Collector()
        thread.submit([Submission(Sequence([5, 6], SamplingParams(max_tokens=3)), good)])
        assert good.done.wait(30)
        assert good.reason is FinishReason.LENGTH and len(good.tokens) == 3
    finally:
        thread.shutdown()


def test_the_engine_thread_and_its_forward_workers_take_its_nice_value(tiny_model_dir):
    def nice_values() -> list[int]:
        values = []
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):  # an earlier test's OpenMP worker may end meanwhile
                values.append(os.getpriority(os.PRIO_PROCESS, int(tid)))
        return values

    before = nice_values().count(7)
    engine = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=64, block_size=8))
    thread = EngineThread(engine, nice=7)  # raising the value needs no privilege
    thread.start()
    try:
        done = Collector()
        thread.submit([Submission(Sequence(list(range(5, 60)), SamplingParams(max_tokens=4)), done)])
        assert done.done.wait(30)
        assert os.getpriority(os.PRIO_PROCESS, thread._thread.native_id) == 7
        assert nice_values().count(7) - before >= torch.get_num_threads()  # the OpenMP team came from this thread
    finally:
        thread.shutdown()


def test_no_cancellation_probe_runs_once_a_sequence_has_finished(tiny_model_dir):
    """Triton releases a request once its final response is sent; a probe of it after that (tritonserver 2.51's
    TRITONBACKEND_ResponseFactoryIsCancelled on a freed factory) crashes the server."""
    engine = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=256, block_size=8))
    thread = EngineThread(engine, cancel_probe_interval=0.001)
    thread.start()
    late_probes: list[int] = []
    try:
        collectors = []
        for i in range(8):
            c = Collector()

            def probe(c=c, i=i) -> bool:
                if c.done.is_set():
                    late_probes.append(i)
                time.sleep(0.002)  # a round trip to the server
                return False

            collectors.append(c)
            thread.submit([Submission(Sequence([5, 6, 7 + i], SamplingParams(max_tokens=4 + 3 * i)), c, probe)])
        for c in collectors:
            assert c.done.wait(30)
        time.sleep(0.05)
    finally:
        thread.shutdown()
    assert late_probes == []


def test_loading_on_its_own_thread_leaves_no_openmp_pool_behind():
    """A thread that has run a parallel region keeps OpenMP workers alive beside it; the loader thread's go when it
    ends. In a fresh process, since pytest's own thread has a pool already."""
    script = textwrap.dedent(
        """
        import os
        import time

        import torch
        from tritonllm.engine.engine_thread import load_on_own_thread

        def threads():
            return len(os.listdir("/proc/self/task"))

        def parallel_work():
            return torch.ones(1 << 22).add_(1).sum()

        before = threads()
        load_on_own_thread(parallel_work)
        deadline = time.monotonic() + 10
        while threads() > before and time.monotonic() < deadline:  # workers end a moment after their thread
            time.sleep(0.05)
        after_loader = threads()
        parallel_work()
        time.sleep(0.5)
        print(before, after_loader, threads())
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "2"}, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    before, after_loader, after_here = map(int, run.stdout.split())
    assert after_loader == before
    assert after_here > after_loader  # the count does see a pool


def test_loading_failure_reaches_the_caller():
    def broken():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        load_on_own_thread(broken)


def test_a_paused_engine_takes_requests_in_without_stepping_and_runs_them_together_when_resumed(tiny_model_dir):
    engine = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=256, block_size=8, max_num_seqs=8))
    thread = EngineThread(engine)
    thread.start()
    try:
        thread.pause(True)
        collectors = [Collector() for _ in range(6)]
        for i, collector in enumerate(collectors):
            thread.submit([Submission(Sequence([5, 6, 7 + i], SamplingParams(max_tokens=4)), collector)])
        cancelled = Collector()
        thread.submit([Submission(Sequence([9, 9], SamplingParams(max_tokens=4), request_id="gone"), cancelled)])
        thread.cancel("gone")
        assert cancelled.done.wait(30) and cancelled.reason is FinishReason.CANCELLED  # handled while paused
        deadline = time.monotonic() + 30
        while len(engine.scheduler.waiting) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(engine.scheduler.waiting) == 6 and engine.stats.steps == 0
        thread.pause(False)
        for collector in collectors:
            assert collector.done.wait(30) and len(collector.tokens) == 4
        assert engine.stats.steps == 4  # all six in every step: admitted together
    finally:
        thread.shutdown()
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_end_all_ends_every_sequence_then_calls_back_after_their_final_outputs(tiny_model_dir):
    """The llm's stop (backend/unload_watch.py): every live sequence, running or waiting, ends cancelled and its
    blocks return; what `then` does (closing the channels) comes after every final output."""
    engine = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=256, block_size=8, max_num_seqs=2))
    thread = EngineThread(engine)
    thread.start()
    order: list[str] = []
    try:
        collectors = [Collector() for _ in range(4)]  # two running, two waiting for a place
        for i, collector in enumerate(collectors):
            sequence = Sequence([5, 6, 7 + i], SamplingParams(max_tokens=1500))
            thread.submit(
                [Submission(sequence, lambda out, c=collector: (c(out), out.finished and order.append("out")))]
            )
        assert collectors[0].first.wait(30)
        assert thread.num_live() == 4
        called = threading.Event()
        thread.end_all(then=lambda: (order.append("then"), called.set()))
        assert called.wait(30)
        assert all(c.done.is_set() and c.reason is FinishReason.CANCELLED for c in collectors)
        assert order == ["out"] * 4 + ["then"] and thread.num_live() == 0
    finally:
        thread.shutdown()
    assert engine.blocks.num_free == engine.blocks.num_blocks
