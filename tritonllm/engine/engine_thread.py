"""Runs the engine on one background thread, so callers (Triton's `execute()`) hand work over and never block.

Callers submit a sequence with a callback; the thread admits new work and cancellations between steps, runs
steps while there is work, and calls each sequence's callback with its new tokens. Callbacks and the per-step
hook run on this thread. Cancellation probes run on a watcher thread of their own: each is a round trip to the
server, which the engine thread should not wait on between steps.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from tritonllm.common.errors import Overloaded
from tritonllm.engine.engine import LLMEngine, StepOutput
from tritonllm.engine.state.sequence import FinishReason, Sequence

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Submission:
    seq: Sequence
    on_output: Callable[[StepOutput], None]
    is_cancelled: Callable[[], bool] | None = None


class CancellationProbe:
    """Asks Triton whether a request was cancelled, until the request is retired.

    A request is retired before its final output is handed over, and retiring waits for a probe under way: Triton
    releases a request once its final response is sent, and tritonserver 2.51 crashes when a released request is
    probed (TRITONBACKEND_ResponseFactoryIsCancelled on a freed factory).
    """

    def __init__(self, is_cancelled: Callable[[], bool]) -> None:
        self._is_cancelled = is_cancelled
        self._lock = threading.Lock()  # one per request: retiring waits for this request's probe only
        self._retired = False

    def cancelled(self) -> bool:
        with self._lock:
            if self._retired:
                return False
            try:
                return self._is_cancelled()
            except Exception:
                log.exception("cancellation probe failed")
                return False

    def retire(self) -> None:
        with self._lock:
            self._retired = True


class FinishRate:
    """Sequences finished a second lately: between the last `window` finishes of the last `horizon_s` seconds, so
    that an idle spell before a burst does not make the engine look slow."""

    def __init__(self, window: int = 32, horizon_s: float = 30.0) -> None:
        self._times: deque[float] = deque(maxlen=window)  # appended by the engine thread, read by submitters
        self.horizon_s = horizon_s

    def record(self, at: float | None = None) -> None:
        """A sequence finished `at` (time.monotonic(); now by default)."""
        self._times.append(time.monotonic() if at is None else at)

    def per_second(self, now: float | None = None) -> float | None:
        """None while fewer than two finishes are recent: nothing to go by."""
        since = (time.monotonic() if now is None else now) - self.horizon_s
        times = [t for t in list(self._times) if t >= since]
        if len(times) < 2 or times[-1] <= times[0]:
            return None
        return (len(times) - 1) / (times[-1] - times[0])


class EngineThread:
    def __init__(
        self,
        engine: LLMEngine,
        on_step: Callable[[LLMEngine], None] | None = None,
        max_queue_size: int = 0,
        max_queue_wait: float = 0.0,
        cancel_probe_interval: float = 0.1,
        nice: int = 0,
    ) -> None:
        self.engine = engine
        self.on_step = on_step
        self.max_queue_size = max_queue_size  # 0: unbounded
        self.max_queue_wait = max_queue_wait  # seconds; 0: unbounded
        self.finishes = FinishRate()
        # with max_queue_wait, the priorities of the sequences handed over but not yet taken in (the inbox cannot be
        # looked into)
        self._handed: Counter[int] = Counter()
        self._handed_lock = threading.Lock()
        # Every probe costs the server CPU that the forward pass needs too, so a sweep runs this often (seconds).
        self.cancel_probe_interval = cancel_probe_interval
        self.nice = nice
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[int, Submission] = {}
        # seq_id -> the cancellation probe of each live sequence whose request has one; shared with the watcher thread
        self._probes: dict[int, CancellationProbe] = {}
        self._probes_lock = threading.Lock()
        self._stopping = threading.Event()
        self._paused = False  # no steps: requests wait (pause)
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="llm-cancel-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._watcher.start()

    def num_queued(self) -> int:
        """Requests not yet running: handed over but not taken in, or waiting for admission (any thread)."""
        return self._inbox.qsize() + len(self.engine.scheduler.waiting)

    def submit(self, submissions: list[Submission]) -> None:
        """Hands one request's sequences to the engine, all or none: Overloaded at once when the queue is full, or
        when the request would wait longer than max_queue_wait; either says when a retry may be taken in."""
        queued = self.num_queued()
        if self.max_queue_size and queued + len(submissions) > self.max_queue_size:
            over, rate = queued + len(submissions) - self.max_queue_size, self.finishes.per_second()
            raise Overloaded(
                "max_queue_size",
                f"overloaded: {queued} requests queued (max_queue_size={self.max_queue_size}); retry later",
                math.ceil(over / rate) if rate else 1,
            )
        if self.max_queue_wait:
            self._judge_wait(submissions)
        for submission in submissions:
            self._inbox.put(("add", submission))

    def _judge_wait(self, submissions: list[Submission]) -> None:
        """Overloaded when the request would wait longer than max_queue_wait; else counts it as handed over."""
        priority = min(s.seq.priority for s in submissions)
        ahead, rate = self._waiting_ahead(priority), self.finishes.per_second()
        if ahead and rate and ahead / rate > self.max_queue_wait:
            wait = ahead / rate
            raise Overloaded(
                "max_queue_wait",
                f"overloaded: {ahead} requests ahead, some {wait:.1f} s of waiting at {rate:.2f} finished a second "
                f"(max_queue_wait={self.max_queue_wait:g} s); retry later",
                math.ceil(wait - self.max_queue_wait),
            )
        with self._handed_lock:
            self._handed.update(s.seq.priority for s in submissions)

    def _waiting_ahead(self, priority: int) -> int:
        """Sequences a new one of `priority` would wait behind: those of its priority or higher handed over but not
        taken in, or waiting for admission (a copy of the list: the engine thread changes it)."""
        with self._handed_lock:
            handed = sum(count for rank, count in self._handed.items() if rank <= priority)
        return handed + sum(1 for seq in list(self.engine.scheduler.waiting) if seq.priority <= priority)

    def cancel(self, request_id: str) -> None:
        """Cancels every live sequence submitted under `request_id`."""
        self._inbox.put(("cancel", request_id))

    def pause(self, paused: bool) -> None:
        """True: no more steps once this reaches the engine (requests are still taken in, and cancellations end
        them); False: steps again."""
        self._inbox.put(("pause", paused))

    def num_live(self) -> int:
        """Sequences handed to the engine and not finished, plus whatever else waits in the inbox (a cancellation, a
        pause): zero once no work is left (any thread)."""
        return len(self._live) + self._inbox.qsize()

    def end_all(self, then: Callable[[], None]) -> None:
        """Ends every live sequence (cancelled), then calls `then` on the engine thread: what it does comes after
        their final outputs."""
        self._inbox.put(("end_all", then))

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout)
        self._watcher.join(timeout)
        self.engine.close()

    def _run(self) -> None:
        self._set_priority()
        while not self._stopping.is_set():
            try:
                self._iterate()
            except Exception:
                # Whatever broke, the thread must live on: a dead engine thread hangs every request for good.
                log.exception("engine loop failed; ending every live sequence")
                self._fail_all(FinishReason.ERROR)
        self._fail_all(FinishReason.CANCELLED)

    def _set_priority(self) -> None:
        """Gives this thread, and the OpenMP workers it starts for the forward pass (they inherit it), the nice value
        `nice`. On a CPU host the server's other threads share the cores with the forward pass, and each of its
        parallel regions waits for its slowest thread: every preemption stalls all of them. Below 0 needs
        CAP_SYS_NICE; without it the thread keeps its priority."""
        if not self.nice:
            return
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        except OSError as e:
            log.warning("engine thread keeps its CPU priority: nice %d needs CAP_SYS_NICE (%s)", self.nice, e)

    def _iterate(self) -> None:
        # Block only when idle (or paused); between steps just drain what has arrived.
        self._drain(block=self._paused or not self.engine.has_work())
        if self.engine.has_work() and not self._paused:
            self._step()
        if self.on_step is not None:
            self.on_step(self.engine)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception:
            log.exception("engine step failed; ending every live sequence")
            self._fail_all(FinishReason.ERROR)
            return
        for out in outputs:
            self._deliver(out)

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload) -> None:
        if kind == "add":
            sub: Submission = payload
            if self.max_queue_wait:  # counted as handed over only then (_judge_wait)
                with self._handed_lock:
                    self._handed[sub.seq.priority] -= 1
            self._live[sub.seq.seq_id] = sub
            if sub.is_cancelled is not None:
                with self._probes_lock:
                    self._probes[sub.seq.seq_id] = CancellationProbe(sub.is_cancelled)
            try:
                self.engine.add(sub.seq)
            except Exception:
                log.exception("could not admit request %s", sub.seq.request_id)
                self._end(sub, FinishReason.ERROR)
        elif kind == "cancel":
            for sub in [s for s in self._live.values() if s.seq.request_id == payload]:
                self._end(sub, FinishReason.CANCELLED)
        elif kind == "pause":
            self._paused = payload
        elif kind == "end_all":
            self._fail_all(FinishReason.CANCELLED)
            payload()
        elif kind == "cancelled":
            sub = self._live.get(payload)
            if sub is not None:
                self._end(sub, FinishReason.CANCELLED)

    def _watch(self) -> None:
        while not self._stopping.wait(self.cancel_probe_interval):
            with self._probes_lock:
                probes = list(self._probes.items())
            for seq_id, probe in probes:
                if probe.cancelled():
                    with self._probes_lock:
                        self._probes.pop(seq_id, None)
                    self._inbox.put(("cancelled", seq_id))

    def _end(self, sub: Submission, reason: FinishReason) -> None:
        self.engine.abort(sub.seq)
        sub.seq.finish_reason = reason
        self._deliver(StepOutput(sub.seq, [], self.engine.last_batch_size))

    def _deliver(self, out: StepOutput) -> None:
        sub = self._live.get(out.seq.seq_id)
        if sub is None:
            return
        if out.finished:
            del self._live[out.seq.seq_id]
            self.finishes.record()
            with self._probes_lock:
                probe = self._probes.pop(out.seq.seq_id, None)
            if probe is not None:
                probe.retire()
        try:
            sub.on_output(out)
        except Exception:
            log.exception("output callback of request %s failed; cancelling it", out.seq.request_id)
            if not out.finished:
                self._end(sub, FinishReason.CANCELLED)

    def _fail_all(self, reason: FinishReason) -> None:
        for sub in list(self._live.values()):
            self._end(sub, reason)


def load_on_own_thread(load: Callable[[], T]) -> T:
    """Runs `load` (building the engine: loading the model, packing its weights) on a thread that then ends.

    libgomp keeps an OpenMP thread pool for every thread that has run a parallel region, for as long as that
    thread lives. Were the model loaded on the host's main thread (Triton's stub calls initialize() there), its
    pool would stay beside the engine thread's, libgomp would count more OpenMP threads than cores, and its
    workers would then sleep after some 100 spins between parallel regions instead of ~3 ms, so each region of
    the forward pass pays for waking them. A thread that ends takes its pool with it. For the same reason the
    host's thread must not run parallel torch work later (request parsing only makes numpy arrays and views).
    """
    # leaving the block joins the worker thread; result() re-raises what load raised
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-load") as loader:
        return loader.submit(load).result()
