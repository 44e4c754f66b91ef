"""Stop strings matched on text, since a stop string can span tokens or end inside one."""

from __future__ import annotations


class StopStringMatcher:
    """Feed text increments; get back what is safe to emit, holding back a tail that may begin a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        if self.matched is not None:
            return ""
        pending = self._held + text
        hits = [(pending.find(s), s) for s in self.stops if s in pending]
        if hits:
            index, self.matched = min(hits)
            self._held = ""
            return pending[:index]
        keep = max((_overlap(pending, s) for s in self.stops), default=0)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """The held-back tail, once the generation has ended without a match."""
        held, self._held = self._held, ""
        return held


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
