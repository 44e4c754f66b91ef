"""Which of a streamed sequence's tokens its next response carries: every `interval` new tokens, the first and
the last at once.

Each streamed response costs the server CPU of its own on every hop (llm, ensemble, postprocessing, gRPC),
which on a CPU host the forward pass loses. An interval of 2 sends half as many while the sender keeps up; once
it falls behind, its merging of queued responses already does so (bench/results/W1.md, case e2). Time to first
token does not change. Same knob as vLLM's and SGLang's
`--stream-interval`; the default, 1, sends every token as it comes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StreamInterval:
    interval: int = 1
    sent: int = 0  # output tokens already handed to a response

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {self.interval}")

    def take(self, num_output_tokens: int, finished: bool) -> slice | None:
        """The span of output tokens the next response carries, or None while they wait for company."""
        unsent = num_output_tokens - self.sent
        if self.sent and unsent < self.interval and not finished:
            return None
        span = slice(self.sent, num_output_tokens)
        self.sent = num_output_tokens
        return span
