"""A reasoning model's thinking held to a budget of tokens, as llama.cpp's reasoning budget holds it: once the
thinking block has run `tokens` tokens without closing, its closing tag is forced token by token, and the answer
follows from the model as usual. Until then nothing changes: a greedy answer that closes its block in time is
the same token for token.

The tags are token ids (preprocessing tokenizes `<think>` and `</think>`): the block opens where the output
first holds the opening ids (or at once, when the prompt opened it) and closes where it next holds the closing
ids, however the model got there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThinkingBudget:
    tokens: int  # thinking tokens allowed, the opening tag not counted
    start_ids: tuple[int, ...]  # the opening tag; empty: the prompt opened the block, the answer starts inside
    end_ids: tuple[int, ...]  # the closing tag


class ThinkingTracker:
    """Where one sequence's output stands against its budget, advanced with each token it gets."""

    def __init__(self, budget: ThinkingBudget) -> None:
        self.budget = budget
        self.phase = "inside" if not budget.start_ids else "before"
        self.spent = 0  # tokens inside the block so far
        self.recent: list[int] = []  # the last tokens, as many as the longer tag

    def advance(self, token: int) -> None:
        budget = self.budget
        self.recent = (self.recent + [token])[-max(len(budget.start_ids), len(budget.end_ids)) :]
        if self.phase == "before" and _ends_with(self.recent, budget.start_ids):
            self.phase = "inside"
        elif self.phase == "inside":
            self.spent += 1
            if _ends_with(self.recent, budget.end_ids):
                self.phase = "after"

    def forced(self) -> int | None:
        """The token the closing forces next; None while the model chooses."""
        if self.phase != "inside":
            return None
        k = self.spent - self.budget.tokens
        return self.budget.end_ids[k] if 0 <= k < len(self.budget.end_ids) else None


def _ends_with(tokens: list[int], tag: tuple[int, ...]) -> bool:
    return len(tokens) >= len(tag) and tuple(tokens[len(tokens) - len(tag) :]) == tag
