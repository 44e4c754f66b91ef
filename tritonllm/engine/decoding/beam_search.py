"""Beam search over sequences of the in-flight batch, with the rules of transformers' `generate(num_beams=...)`.

Each live beam is an ordinary Sequence in the batch. When every live beam has its next-token logits, one search
step ranks the 2 x width best continuations by summed log-probability (log-softmax, then the request's logits
processors), keeps the best `width` that did not finish as the next live beams, and offers the top `width`
that finished (end_id, stop word or length) to the pool of hypotheses, scored sum / length ** length_penalty.
Stopping follows `early_stopping`: True ends once `width` hypotheses are done, False when the best live beam
can no longer beat the worst hypothesis at its current length, "never" at the length where it could.

The engine moves the beams' KV caches: a continuation takes its parent's blocks (shared, copied on write).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonllm.engine.decoding.logits_processors import ends_with_any, process
from tritonllm.engine.state.sequence import Sequence

EarlyStopping = bool | str  # True, False or "never"


@dataclass
class Hypothesis:
    output_ids: list[int]
    log_probs: list[float]  # of each token, from the unprocessed logits (as every reported log-prob)
    cum_log_prob: float  # sum of the processed log-probs that ranked it
    score: float  # cum_log_prob / len(output_ids) ** length_penalty


@dataclass
class Continuation:
    parent: Sequence
    token: int
    cum_log_prob: float
    log_prob: float  # unprocessed
    finishes: bool


@dataclass(eq=False)
class BeamSearch:
    lead: Sequence  # the request's own sequence; always one of the live beams until the search is done
    width: int
    length_penalty: float
    early_stopping: EarlyStopping
    max_tokens: int  # of output, bounded by the model's length
    live: list[Sequence] = field(default_factory=list)  # best first
    cum_log_probs: dict[int, float] = field(default_factory=dict)  # by seq_id of the live beams
    token_log_probs: dict[int, list[float]] = field(default_factory=dict)
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # next-token logits of live beams, by seq_id
    hypotheses: list[Hypothesis] = field(default_factory=list)  # best first, at most `width`
    improvable: bool = True
    done: bool = False

    def __post_init__(self) -> None:
        self.live = [self.lead]
        self.cum_log_probs = {self.lead.seq_id: 0.0}
        self.token_log_probs = {self.lead.seq_id: []}

    def offer(self, seq: Sequence, logits: torch.Tensor) -> bool:
        """Records a live beam's logits; True when every live beam has them and the search can step."""
        self.rows[seq.seq_id] = logits
        return len(self.rows) == len(self.live)

    def step(self) -> list[Continuation]:
        """Ranks the continuations of the live beams; returns the next live beams (empty when done)."""
        raw = torch.stack([self.rows[s.seq_id] for s in self.live]).float()
        self.rows = {}
        log_probs = torch.log_softmax(raw, -1)
        ranked = torch.stack(
            [process(row, seq) + self.cum_log_probs[seq.seq_id] for row, seq in zip(log_probs, self.live, strict=True)]
        )
        vocab = ranked.shape[1]
        top = torch.topk(ranked.flatten(), min(2 * self.width, ranked.numel()))
        generated = self.live[0].num_output_tokens + 1
        candidates = []
        for value, index in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            beam, token = divmod(index, vocab)
            parent = self.live[beam]
            finishes = generated >= self.max_tokens or token == parent.params.end_id
            if not finishes and parent.params.stop_words:
                finishes = ends_with_any(parent.output_ids + [token], parent.params.stop_words)
            candidates.append(Continuation(parent, token, value, float(log_probs[beam, token]), finishes))

        if self.improvable and not (self.early_stopping is True and self._full()):
            for c in candidates[: self.width]:
                if c.finishes:
                    self.hypotheses.append(self._hypothesis(c, generated))
            self.hypotheses = sorted(self.hypotheses, key=lambda h: -h.score)[: self.width]
        following = [c for c in candidates if not c.finishes][: self.width]
        if self._full() and following:
            length = self.max_tokens if self.early_stopping == "never" and self.length_penalty > 0 else generated
            best = following[0].cum_log_prob / length**self.length_penalty
            self.improvable = self.improvable and best > self.hypotheses[-1].score
        self.done = not following or not self.improvable or (self.early_stopping is True and self._full())
        return [] if self.done else following

    def continue_with(self, beams: list[Sequence], chosen: list[Continuation]) -> None:
        """Makes `beams[i]` the live beam of `chosen[i]` (its tokens are already set by the engine)."""
        self.cum_log_probs = {b.seq_id: c.cum_log_prob for b, c in zip(beams, chosen, strict=True)}
        self.token_log_probs = {
            b.seq_id: self.token_log_probs[c.parent.seq_id] + [c.log_prob] for b, c in zip(beams, chosen, strict=True)
        }
        self.live = list(beams)

    def results(self) -> list[Hypothesis]:
        """The best `width` beams, best first; a search ended early ranks its live beams in as they stand."""
        pool = list(self.hypotheses)
        if not self.done:
            for seq in self.live:
                n = max(seq.num_output_tokens, 1)
                cum = self.cum_log_probs[seq.seq_id]
                pool.append(
                    Hypothesis(seq.output_ids, self.token_log_probs[seq.seq_id], cum, cum / n**self.length_penalty)
                )
        return sorted(pool, key=lambda h: -h.score)[: self.width]

    def _full(self) -> bool:
        return len(self.hypotheses) == self.width

    def _hypothesis(self, c: Continuation, generated: int) -> Hypothesis:
        log_probs = self.token_log_probs[c.parent.seq_id] + [c.log_prob]
        score = c.cum_log_prob / generated**self.length_penalty
        return Hypothesis(c.parent.output_ids + [c.token], log_probs, c.cum_log_prob, score)
