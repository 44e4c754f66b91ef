"""Counters and latency observations the engine keeps as it steps, for whoever exports metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineStats:
    prompt_tokens: int = 0  # of requests that started (not recounted when a preempted one recomputes)
    generation_tokens: int = 0
    steps: int = 0
    last_step_tokens: int = 0
    last_batch_size: int = 0
    # Speculative decoding: draft tokens verified, how many of them were kept, and in how many verifications.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    verifications: int = 0
    # Seconds, gathered since the last drain.
    time_to_first_token: list[float] = field(default_factory=list)
    inter_token_latency: list[float] = field(default_factory=list)
    queue_time: list[float] = field(default_factory=list)

    def drain(self) -> tuple[list[float], list[float], list[float]]:
        out = (self.time_to_first_token, self.inter_token_latency, self.queue_time)
        self.time_to_first_token, self.inter_token_latency, self.queue_time = [], [], []
        return out
