"""Per-request decoding settings, already validated by the caller."""

from __future__ import annotations

from dataclasses import dataclass

NO_END_ID = -1


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means the whole vocabulary
    top_p: float = 1.0
    seed: int | None = None
    end_id: int = NO_END_ID
    # Which request-level fields the engine honours grows in later issues (penalties, beams, ...).

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1
