"""The multiplexed channels an llm instance holds (tritonllm/wire/multiplex.py). Imported only inside Triton's Python
backend.

A channel is a decoupled request kept open: Triton releases it, and unloads the model, only after its final
response. Its client closes it with a stop request; a client that goes away without one (its process killed)
leaves it to this instance, which sweeps the channels for cancelled ones and closes them. When Triton stops the
model, the model closes them all once its generations have ended (unload_watch.py).

Triton 2.51 crashes when a released request is probed for cancellation (TRITONBACKEND_ResponseFactoryIsCancelled
on a freed factory), so a channel is probed only under the lock that taking it holds, and closed only once taken.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported at run time inside Triton's Python backend only
    from tritonllm.backend.llm_responses import ResponseQueue

log = logging.getLogger(__name__)


class OpenChannels:
    """Each open channel's response sender by the id of the request that opened it; closes those whose client has
    gone, every `sweep_interval_s` seconds, on a thread of its own."""

    def __init__(self, responses: ResponseQueue, sweep_interval_s: float = 0.25) -> None:
        self._responses = responses
        self._senders: dict[str, object] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sweep_interval_s = sweep_interval_s
        self._thread = threading.Thread(target=self._sweep, name="llm-channels", daemon=True)
        self._thread.start()

    def open(self, channel_id: str, sender) -> None:
        with self._lock:
            self._senders[channel_id] = sender

    def close(self, channel_id: str) -> bool:
        """Closes the channel (its FINAL after every response queued for it); False where this instance holds none
        of that id."""
        with self._lock:
            sender = self._senders.pop(channel_id, None)
        if sender is not None:
            self._responses.end_channels([sender])
        return sender is not None

    def close_all(self) -> None:
        with self._lock:
            senders, self._senders = list(self._senders.values()), {}
        if senders:
            self._responses.end_channels(senders)

    def live(self, channel_id: str):
        """The channel's sender while its client is there; None where there is none (closed where its client has
        gone)."""
        with self._lock:
            sender = self._senders.get(channel_id)
            if sender is None or not self._cancelled(sender):
                return sender
            del self._senders[channel_id]
        self._responses.end_channels([sender])
        return None

    def stop(self) -> None:
        """Ends the sweeps (the model's finalize: every channel has been closed by then, or Triton would not
        unload)."""
        self._closed.set()
        self._thread.join()

    def _sweep(self) -> None:
        while not self._closed.wait(self._sweep_interval_s):
            for channel_id in list(self._senders):
                self.live(channel_id)

    @staticmethod
    def _cancelled(sender) -> bool:
        try:
            return sender.is_cancelled()
        except Exception:
            log.exception("cancellation probe of a channel failed")
            return False
