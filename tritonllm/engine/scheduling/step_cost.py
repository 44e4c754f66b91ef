"""How long a step takes for how many tokens, learned from the steps themselves, and the prefill it can afford.

A step's time is close to a line in the tokens it feeds: a fixed part (the weights are read once a step, the
per-layer work of the framework) plus a part per token. While streams are decoding, every step that also carries
prefill makes each of them wait that much longer for its next token. Capping a step's prefill at
(slowdown - 1) * (fixed / per_token + decodes) tokens keeps it within `slowdown` times a decode-only step, so the
inter-token latency stays within that multiple of its median, and prompts still go in as fast as that allows.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_STEPS = 8  # steps seen before the line is trusted
MIN_SPREAD = 0.1  # the step sizes' standard deviation, relative to their mean, that a new line needs


@dataclass
class StepCost:
    slowdown: float = 2.0  # a step with prefill and decodes, at most this times a decode-only step; 0: no limit
    decay: float = 0.98  # weight of the step before, in the running least-squares fit
    min_prefill: int = 16  # a prompt always advances, however slow the steps
    # exponentially weighted sums of (tokens, seconds) for the least-squares line
    _w: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0
    _line: tuple[float, float] | None = None  # the last line the steps determined: (fixed, per_token) seconds

    def observe(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self._w = d * self._w + 1.0
        self._x = d * self._x + tokens
        self._y = d * self._y + seconds
        self._xx = d * self._xx + tokens * tokens
        self._xy = d * self._xy + tokens * seconds
        self._line = self._fit() or self._line

    def _fit(self) -> tuple[float, float] | None:
        """The line through the recent steps, when their sizes vary enough to tell its two parts apart."""
        spread = self._w * self._xx - self._x * self._x  # the weighted variance of the step sizes, times weight^2
        if self._w < MIN_STEPS or spread < (MIN_SPREAD * self._x) ** 2:
            return None  # steady decoding: the steps alike, so the line of livelier times stays
        per_token = (self._w * self._xy - self._x * self._y) / spread
        fixed = (self._y - per_token * self._x) / self._w
        return (fixed, per_token) if per_token > 0 and fixed > 0 else None

    def prefill_allowance(self, decodes: int) -> int | None:
        """Prefill tokens a step feeding `decodes` decode tokens may add; None: no limit (no stream waits, or
        nothing learned yet)."""
        if decodes == 0 or self.slowdown <= 0 or self._line is None:
            return None
        fixed, per_token = self._line
        return max(self.min_prefill, round((self.slowdown - 1.0) * (fixed / per_token + decodes)))

    def token_share(self, tokens: int) -> float | None:
        """What one more token adds to a step of `tokens` tokens, as a share of that step; None: not learned yet."""
        if self._line is None:
            return None
        fixed, per_token = self._line
        return per_token / (fixed + per_token * tokens)
