"""Draft tokens from the sequence's own text (n-gram prompt lookup), for the engine to verify in a decode step.

When the sequence's last n tokens occurred before, in its prompt or its output, the tokens that followed them
then are a cheap guess at what follows now: code being edited, a summary quoting its source, a list repeating
its shape. The guess costs no model; the step verifies it exactly (engine._sample, sampler._speculative), so
greedy output is the same token for token and sampling keeps its distribution. The longest n from `max_n` down
to `min_n` that matches wins, and the latest earlier occurrence of it. vLLM's `ngram` speculative method and
llama.cpp's lookup decoding work the same way.

Verifying is not free on a CPU: each draft is one more row through every layer (on SmolLM2's Q4_1 file, one
sequence's step takes 1.16x as long with one draft and 2.3x with four). So each sequence drafts only as many
tokens as pay for themselves: with its recent acceptance rate a (each draft kept with probability a until the
first miss), k drafts bring (1 - a^(k+1)) / (1 - a) tokens for a step that costs (1 + k * share), where share is
one more row's share of the step (step_cost.py); k maximizes the ratio. Text that stops repeating itself soon
drafts nothing, and tries again after DORMANT_TOKENS tokens.

Each sequence's n-grams are indexed as its tokens grow, so a draft costs a few dictionary lookups, not a scan
of the context.

A request's prediction (OpenAI's Predicted Outputs: the answer is expected to repeat much of a given text, as
an edited file does) is drafted from instead of the sequence's own text, with or without `speculative`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from tritonllm.engine.state.sequence import Sequence

DECAY = 0.7  # weight of the verifications before the last one, in a sequence's acceptance rate
# A sequence that drafts nothing tries one draft again after this many tokens of its own (not engine steps:
# how many steps it sat out depends on the batch, and a sampled sequence's draws must not)
DORMANT_TOKENS = 16
DEFAULT_ROW_SHARE = 0.25  # one more row's share of a step, until the engine has measured its steps
PREDICTION_PRIOR = 3.0  # drafts from a request's prediction start as if 3 of 4 were kept
# Drafting must promise this many times the tokens per unit of time of not drafting: the line of step times
# leaves out what a drafted row costs beside the forward pass (its sampling, the drafting itself), and a free
# answer lost 10% with drafts taken at any expected gain (bench/results/speculation.md).
MIN_GAIN = 1.1


@dataclass
class NgramIndex:
    """For each n, each n-gram of the tokens seen so far -> the position right after its latest occurrence
    that has a token following it."""

    sizes: range
    after: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # the n-grams ending at or before this position are in `after`

    def update(self, tokens: list[int]) -> None:
        # an n-gram ending at `end` is followed by tokens[end] only once the sequence is longer than `end`
        for end in range(self.indexed + 1, len(tokens)):
            for n in self.sizes:
                if end >= n:
                    self.after[tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, len(tokens) - 1)

    def follower(self, tokens: list[int]) -> int | None:
        """Where the indexed text went on after its latest occurrence of the longest n-gram ending `tokens`."""
        for n in reversed(self.sizes):
            if len(tokens) > n:
                start = self.after.get(tuple(tokens[-n:]))
                if start is not None:
                    return start
        return None

    def continuation(self, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the longest earlier occurrence of the tokens' last n (the index
        being of `tokens` themselves)."""
        start = self.follower(tokens)
        return [] if start is None else tokens[start : start + limit]


@dataclass
class AcceptanceRate:
    """How often a sequence's drafts are kept: decayed counts of kept drafts and of misses, from a prior of
    one each."""

    kept: float = 1.0
    missed: float = 1.0
    last_draft: int = 0  # the sequence's output tokens when it last drafted

    @property
    def rate(self) -> float:
        return self.kept / (self.kept + self.missed)

    def record(self, drafted: int, accepted: int) -> None:
        self.kept = DECAY * self.kept + accepted
        self.missed = DECAY * self.missed + (accepted < drafted)

    def best_length(self, limit: int, row_share: float, made: int) -> int:
        """The number of drafts, up to `limit`, that brings the most tokens per unit of step time; `made`: the
        sequence's output tokens so far."""
        a, best, best_gain = self.rate, 0, MIN_GAIN
        for k in range(1, limit + 1):
            gain = sum(a**i for i in range(k + 1)) / (1.0 + k * row_share)
            if gain > best_gain:
                best, best_gain = k, gain
        if best == 0 and limit and made - self.last_draft >= DORMANT_TOKENS:
            best = 1  # the text may repeat itself again: one draft finds out
        if best:
            self.last_draft = made
        return best


@dataclass
class PredictionState:
    """Where a sequence's output stands against its request's prediction: while the output is the prediction's
    beginning, the prediction's next tokens are the draft; once they part, its n-gram index finds where the
    output rejoins it (an edit made, the rest copied)."""

    index: NgramIndex
    aligned: int = 0  # output tokens equal to the prediction's first ones
    parted: bool = False

    def continuation(self, seq: Sequence, limit: int) -> list[int]:
        prediction, tokens, start = seq.speculation.prediction, seq.token_ids, seq.num_prompt_tokens
        while not self.parted and start + self.aligned < len(tokens):
            i = self.aligned
            if i < len(prediction) and tokens[start + i] == prediction[i]:
                self.aligned += 1
            else:
                self.parted = True
        if not self.parted:
            return prediction[self.aligned : self.aligned + limit]
        rejoin = self.index.follower(tokens)
        return [] if rejoin is None else prediction[rejoin : rejoin + limit]


@dataclass
class DraftState:
    index: NgramIndex
    acceptance: AcceptanceRate = field(default_factory=AcceptanceRate)
    prediction: PredictionState | None = None


class NgramDrafter:
    def __init__(self, num_tokens: int, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt_lookup_min ({min_n}) must be at least 1 and at most prompt_lookup_max ({max_n})")
        self.num_tokens = num_tokens
        self.sizes = range(min_n, max_n + 1)
        # a sequence's state lives as long as the sequence, however it ends
        self._states: weakref.WeakKeyDictionary[Sequence, DraftState] = weakref.WeakKeyDictionary()

    def draft(self, seq: Sequence, room: int, row_share: float | None = None) -> list[int]:
        """Guessed next tokens of `seq`, at most min(num_tokens, room) and only as many as its acceptance rate
        pays for (`row_share`: one more row's share of the step; None: DEFAULT_ROW_SHARE)."""
        state = self._state(seq)
        share = DEFAULT_ROW_SHARE if row_share is None else row_share
        length = state.acceptance.best_length(min(self.num_tokens, room), share, seq.num_output_tokens)
        if state.prediction is not None:
            return state.prediction.continuation(seq, length) if length else []
        state.index.update(seq.token_ids)
        return state.index.continuation(seq.token_ids, length) if length else []

    def verified(self, seq: Sequence, drafted: int, accepted: int) -> None:
        self._state(seq).acceptance.record(drafted, accepted)

    def _state(self, seq: Sequence) -> DraftState:
        state = self._states.get(seq)
        if state is None:
            state = self._states[seq] = DraftState(NgramIndex(self.sizes))
            if seq.speculation.prediction:
                prediction = NgramIndex(self.sizes)
                prediction.update(seq.speculation.prediction)
                state.prediction = PredictionState(prediction)
                # the client expects the answer to repeat it: trust the first drafts more than a guess
                state.acceptance = AcceptanceRate(kept=PREDICTION_PRIOR)
        return state
