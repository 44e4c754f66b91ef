"""The llm model's Prometheus metrics (`tritonllm_*` on Triton's metrics port). Imported only inside Triton's
Python backend."""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

import triton_python_backend_utils as pb_utils

from tritonllm.backend.llm_responses import take_queued
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.state.sequence import FinishReason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepReading:
    """The engine's numbers after a step, read on the engine thread for the metrics thread."""

    gauges: dict[str, float]
    totals: dict[str, float]
    latencies: dict[str, list[float]]  # by histogram: the seconds observed since the last reading


class EngineMetrics:
    """Prometheus metrics, touched only from a thread of their own (tritonserver 2.51 crashes on two threads).

    Every metric call is a round trip to the server, so the engine thread only reads its numbers and hands them
    over. Gauges are set when their value changes; counters grow by the engine's totals since the last update;
    latency histograms observe every token's time to first token or inter-token latency.
    """

    GAUGES = {
        "kv_blocks_used": "KV cache blocks in use",
        "kv_blocks_free": "KV cache blocks free",
        "requests_running": "Sequences in the running batch",
        "requests_waiting": "Sequences waiting for admission",
        "batch_size": "Sequences in the last engine step",
        "step_tokens": "Tokens (prefill and decode) in the last engine step",
    }
    COUNTERS = {
        "prompt_tokens_total": "Prompt tokens of requests that started",
        "generation_tokens_total": "Tokens generated",
        "preemptions_total": "Sequences preempted for lack of KV blocks or for priority",
        "prefix_cache_hit_tokens_total": "Prompt tokens served from the prefix cache",
        "prefix_cache_queried_tokens_total": "Prompt tokens looked up in the prefix cache",
        "engine_steps_total": "Engine steps run",
        "spec_decode_draft_tokens_total": "Draft tokens verified (speculative decoding)",
        "spec_decode_accepted_tokens_total": "Draft tokens kept (the acceptance rate: kept / verified)",
        "spec_decode_verifications_total": "Decode steps of a sequence that verified drafts (tokens per such step: "
        "(kept + verifications) / verifications)",
    }
    HISTOGRAMS = {
        "time_to_first_token_seconds": (
            "From arrival to the first token",
            [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
        ),
        "inter_token_latency_seconds": (
            "Between consecutive tokens",
            [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28],
        ),
        "queue_time_seconds": ("From arrival to first scheduling", [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10]),
    }

    def __init__(self, instance: str) -> None:
        """`instance`: the model instance's name, the `instance` label of every metric (the instances of a
        model share the server's metric families)."""
        # Every family is kept: a collected family makes later calls on its metrics fail.
        self.families = []

        def family(name: str, text: str, kind):
            self.families.append(pb_utils.MetricFamily(name=f"tritonllm_{name}", description=text, kind=kind))
            return self.families[-1]

        kinds, labels = pb_utils.MetricFamily, {"instance": instance}
        self.gauges = {n: family(n, t, kinds.GAUGE).Metric(labels=labels) for n, t in self.GAUGES.items()}
        self.counters = {n: family(n, t, kinds.COUNTER).Metric(labels=labels) for n, t in self.COUNTERS.items()}
        self.histograms = {
            n: family(n, t, kinds.HISTOGRAM).Metric(labels=labels, buckets=b) for n, (t, b) in self.HISTOGRAMS.items()
        }
        finished = family("requests_finished_total", "Requests ended, by finish reason", kinds.COUNTER)
        self.finished_by_reason = {r: finished.Metric(labels={**labels, "reason": r.value}) for r in FinishReason}
        self.last: dict[str, float] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llm-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops the metrics thread, then lets go of every metric while the stub can still tell the server so. A
        metric deleted at the interpreter's exit, once the stub's shared memory is gone, crashes the stub in Triton
        2.51's Metric::SaveToSharedMemory (a null memory pool: "segfault at 60" in the kernel log at every stop)."""
        self._queue.put(None)
        self._thread.join(10)
        for metrics in (self.gauges, self.counters, self.histograms, self.finished_by_reason):
            metrics.clear()
        self.families.clear()

    def finished(self, reason: FinishReason) -> None:
        self._queue.put(reason)

    def update(self, engine: LLMEngine) -> None:
        """On the engine thread: reads the engine's numbers for the metrics thread."""
        stats, blocks = engine.stats, engine.blocks
        gauges = {
            "kv_blocks_used": blocks.num_used,
            "kv_blocks_free": blocks.num_free,
            "requests_running": len(engine.scheduler.running),
            "requests_waiting": len(engine.scheduler.waiting),
            "batch_size": stats.last_batch_size,
            "step_tokens": stats.last_step_tokens,
        }
        totals = {
            "prompt_tokens_total": stats.prompt_tokens,
            "generation_tokens_total": stats.generation_tokens,
            "preemptions_total": engine.scheduler.num_preemptions,
            "prefix_cache_hit_tokens_total": blocks.prefix_hit_tokens,
            "prefix_cache_queried_tokens_total": blocks.prefix_queried_tokens,
            "engine_steps_total": stats.steps,
            "spec_decode_draft_tokens_total": stats.draft_tokens,
            "spec_decode_accepted_tokens_total": stats.accepted_draft_tokens,
            "spec_decode_verifications_total": stats.verifications,
        }
        latencies = dict(zip(self.HISTOGRAMS, stats.drain(), strict=True))
        self._queue.put(StepReading(gauges, totals, latencies))

    def _run(self) -> None:
        """Applies what has queued up at once: the latest gauges and totals, every latency observed."""
        closing = False
        while not closing:
            items, closing = take_queued(self._queue)
            steps = [item for item in items if isinstance(item, StepReading)]
            try:
                for reason in (item for item in items if isinstance(item, FinishReason)):
                    self.finished_by_reason[reason].increment(1)
                if steps:
                    latencies = {name: [v for step in steps for v in step.latencies[name]] for name in self.HISTOGRAMS}
                    self._apply(steps[-1].gauges, steps[-1].totals, latencies)
            except Exception:
                log.exception("could not update the metrics")

    def _apply(self, gauges: dict[str, float], totals: dict[str, float], latencies: dict[str, list[float]]) -> None:
        for name, value in gauges.items():
            if self.last.get(name) != value:
                self.gauges[name].set(value)
                self.last[name] = value
        for name, value in totals.items():
            grown = value - self.last.get(name, 0)
            if grown:
                self.counters[name].increment(grown)
                self.last[name] = value
        for name, values in latencies.items():
            for value in values:
                self.histograms[name].observe(value)
