"""Merges the streamed responses of a sequence that wait to be sent, so a sender that falls behind catches up.

Sending one response costs about a millisecond of the server's time whatever it holds, so when the engine
produces tokens faster than they can be sent, one response carrying all of a sequence's waiting tokens
replaces several. Nothing is held back to wait for company: responses are merged only when they are already
queued.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace

import numpy as np

TOKEN_AXIS = 2  # [1, beam, tokens, ...]
PER_TOKEN = ("output_ids", "output_log_probs", "top_log_probs", "top_log_prob_ids", "generation_logits")
SUMMED = ("sequence_length",)
# what belongs to the start of the span; every other tensor is a running value and the latest one holds
EARLIEST = ("preceding_ids", "queue_wait_us", "context_logits", "prompt_log_probs")


@dataclass
class PendingResponse:
    sender: object
    arrays: dict[str, np.ndarray]
    final: bool  # Triton's FINAL flag: the request's last response
    wanted: frozenset[str]  # the output names the request asked for
    stream_key: Hashable | None = None  # responses with the same key may be merged; None: never
    mux: tuple[object, str] | None = None  # (a multiplexed channel's sender, this generation's request id)


def merge(earlier: dict[str, np.ndarray], later: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One response covering the tokens of `earlier` and then those of `later`."""
    merged = dict(later)
    for name, value in earlier.items():
        if name not in later or name in EARLIEST:
            merged[name] = value
        elif name in PER_TOKEN:
            merged[name] = np.concatenate([value, later[name]], axis=TOKEN_AXIS)
        elif name in SUMMED:
            merged[name] = value + later[name]
    return merged


def coalesce(pending: list[PendingResponse]) -> list[PendingResponse]:
    """Merges the responses that share a stream key, in order.

    Each merged response goes out at the place of its latest part, so a request's FINAL response, which is
    queued after all its others, is still sent last.
    """
    groups: dict[Hashable, PendingResponse] = {}
    last_place: dict[Hashable, int] = {}
    for place, response in enumerate(pending):
        key = response.stream_key if response.stream_key is not None else ("alone", place)
        if key in groups:
            groups[key] = replace(response, arrays=merge(groups[key].arrays, response.arrays))
        else:
            groups[key] = response
        last_place[key] = place
    return [groups[key] for key in sorted(groups, key=last_place.__getitem__)]
