"""A reasoning model's thinking block, followed token by token: held to a budget of tokens, as llama.cpp's
reasoning budget holds it (once the block has run `tokens` tokens without closing, its closing tag is forced
token by token, and the answer follows from the model as usual), and kept out of a grammar's reach (a request's
constraint applies to the answer after the block, as vLLM's reasoning-aware structured outputs do).

The tags are token ids (preprocessing tokenizes `<think>` and `</think>`). The block is open from the start when
the prompt opened it (no opening ids), or when the output starts with the opening ids; it closes where the
output next holds the closing ids, however the model got there. Without a budget nothing is forced: a greedy
answer is the same token for token.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThinkingBlock:
    tokens: int | None  # thinking tokens allowed, the opening tag not counted; None: no limit (tracked only)
    start_ids: tuple[int, ...]  # the opening tag; empty: the prompt opened the block, the answer starts inside
    end_ids: tuple[int, ...]  # the closing tag


class ThinkingTracker:
    """Where one sequence's output stands: `before` (it may still open the block), `inside`, or `after` (the
    answer, the block closed or never opened)."""

    def __init__(self, block: ThinkingBlock) -> None:
        self.block = block
        self.phase = "inside" if not block.start_ids else "before"
        self.opened = 0  # tokens of the opening tag written so far
        self.spent = 0  # tokens inside the block so far
        self.recent: list[int] = []  # the last tokens inside the block, as many as the closing tag

    def advance(self, token: int) -> bool:
        """Takes the output's next token; True when it belongs to the answer (not to the block or its tags)."""
        block = self.block
        if self.phase == "before":
            if token != block.start_ids[self.opened]:
                self.phase = "after"
                return True
            self.opened += 1
            if self.opened == len(block.start_ids):
                self.phase = "inside"
        elif self.phase == "inside":
            self.spent += 1
            self.recent = (self.recent + [token])[-len(block.end_ids) :]
            if tuple(self.recent) == block.end_ids:
                self.phase = "after"
        else:
            return True
        return False

    @property
    def answering(self) -> bool:
        """Whether the next token belongs to the answer, where a grammar applies."""
        return self.phase == "after"

    def opening_token(self) -> int | None:
        """The opening tag's next token, while the output may still open the block."""
        return self.block.start_ids[self.opened] if self.phase == "before" else None

    def forced(self) -> int | None:
        """The token the closing forces next; None while the model chooses."""
        if self.phase != "inside" or self.block.tokens is None:
            return None
        k = self.spent - self.block.tokens
        return self.block.end_ids[k] if 0 <= k < len(self.block.end_ids) else None
