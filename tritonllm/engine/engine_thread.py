"""Runs the engine on one background thread, so callers (Triton's `execute()`) hand work over and never block.

Callers submit a sequence with a callback; the thread admits new work and cancellations between steps, runs
steps while there is work, and calls each sequence's callback with its new tokens. Callbacks, cancellation
probes and the per-step hook all run on this thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .engine import LLMEngine, StepOutput
from .sequence import FinishReason, Sequence

log = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """The queue of requests waiting for the engine is full; the caller should retry later."""


@dataclass
class Submission:
    seq: Sequence
    on_output: Callable[[StepOutput], None]
    is_cancelled: Callable[[], bool] | None = None


class EngineThread:
    def __init__(
        self,
        engine: LLMEngine,
        on_step: Callable[[LLMEngine], None] | None = None,
        max_queue_size: int = 0,
        cancel_probe_interval: float = 0.02,
    ) -> None:
        self.engine = engine
        self.on_step = on_step
        self.max_queue_size = max_queue_size  # 0: unbounded
        # Asking Triton whether a request is cancelled is a round trip to the server per request, so the
        # probes run at most this often (seconds) rather than every step.
        self.cancel_probe_interval = cancel_probe_interval
        self._last_probe = 0.0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[int, Submission] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def num_queued(self) -> int:
        """Requests not yet running: handed over but not taken in, or waiting for admission (any thread)."""
        return self._inbox.qsize() + len(self.engine.scheduler.waiting)

    def submit(self, submissions: list[Submission]) -> None:
        """Hands one request's sequences to the engine, all or none: Overloaded at once when the queue is full."""
        queued = self.num_queued()
        if self.max_queue_size and queued + len(submissions) > self.max_queue_size:
            raise Overloaded(
                f"overloaded: {queued} requests queued (max_queue_size={self.max_queue_size}); retry later"
            )
        for submission in submissions:
            self._inbox.put(("add", submission))

    def cancel(self, request_id: str) -> None:
        """Cancels every live sequence submitted under `request_id`."""
        self._inbox.put(("cancel", request_id))

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._iterate()
            except Exception:
                # Whatever broke, the thread must live on: a dead engine thread hangs every request for good.
                log.exception("engine loop failed; ending every live sequence")
                self._fail_all(FinishReason.ERROR)
        self._fail_all(FinishReason.CANCELLED)

    def _iterate(self) -> None:
        # Block only when idle; between steps just drain what has arrived.
        self._drain(block=not self.engine.has_work())
        self._probe_cancellations()
        if self.engine.has_work():
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
            self._live[sub.seq.seq_id] = sub
            try:
                self.engine.add(sub.seq)
            except Exception:
                log.exception("could not admit request %s", sub.seq.request_id)
                self._end(sub, FinishReason.ERROR)
        elif kind == "cancel":
            for sub in [s for s in self._live.values() if s.seq.request_id == payload]:
                self._end(sub, FinishReason.CANCELLED)

    def _probe_cancellations(self) -> None:
        now = time.monotonic()
        if now - self._last_probe < self.cancel_probe_interval:
            return
        self._last_probe = now
        for sub in list(self._live.values()):
            if sub.is_cancelled is not None and sub.is_cancelled():
                self._end(sub, FinishReason.CANCELLED)

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
        try:
            sub.on_output(out)
        except Exception:
            log.exception("output callback of request %s failed; cancelling it", out.seq.request_id)
            if not out.finished:
                self._end(sub, FinishReason.CANCELLED)

    def _fail_all(self, reason: FinishReason) -> None:
        for sub in list(self._live.values()):
            self._end(sub, reason)
