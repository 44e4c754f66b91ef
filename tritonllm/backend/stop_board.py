"""Stop requests passed between the llm instances of one tritonserver.

A client ends a generation by sending `llm` a request with `stop` set and the generation's request id. With
several instances, Triton hands that request to any of them, most likely not the one running the generation.
So the instance that gets it cancels its own sequences of that id and tells every other instance of the same
server, which do the same. Instances hear each other on Unix datagram sockets in one folder per server and
model (tritonserver's pid names it; the Python backend's stubs are its children): a send is one system call and
needs no broker, and a folder left by a killed server only holds dead sockets, which are removed when found.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

MAX_ID_BYTES = 4096


def server_folder(model_name: str, server_pid: int | None = None) -> Path:
    """A folder the instances of one model in one tritonserver share (the stop board, the LoRA weights)."""
    pid = os.getppid() if server_pid is None else server_pid
    return Path(tempfile.gettempdir()) / "tritonllm" / f"{pid}-{model_name}"


class StopBoard:
    """This instance's place on the board: `tell` sends a request id to the other instances, and `on_stop` hears
    theirs (on a thread of its own)."""

    def __init__(self, folder: Path, instance_name: str, on_stop: Callable[[str], None]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{instance_name}.sock"
        self.path.unlink(missing_ok=True)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(self.path))
        self._on_stop = on_stop
        self._thread = threading.Thread(target=self._listen, name="stop-board", daemon=True)
        self._thread.start()

    def tell(self, request_id: str) -> int:
        """Sends `request_id` to every other instance; returns how many it reached."""
        message = request_id.encode()[:MAX_ID_BYTES]
        reached = 0
        if not message:  # an empty datagram ends a listener; a stop needs an id anyway
            return reached
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            for peer in self.path.parent.glob("*.sock"):
                if peer == self.path:
                    continue
                try:
                    sender.sendto(message, str(peer))
                    reached += 1
                except (ConnectionRefusedError, FileNotFoundError):
                    peer.unlink(missing_ok=True)  # its instance is gone
                except OSError as e:
                    log.warning("stop for %r not passed to %s: %s", request_id, peer.name, e)
        return reached

    def _listen(self) -> None:
        while True:
            try:
                message = self._socket.recv(MAX_ID_BYTES)
            except OSError:
                return  # closed
            if not message:
                return
            try:
                self._on_stop(message.decode(errors="replace"))
            except Exception:
                log.exception("stop from another instance failed")

    def close(self) -> None:
        try:
            # recv() does not return when the socket is closed under it: an empty datagram ends the listener.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as waker:
                waker.sendto(b"", str(self.path))
        except OSError:
            pass
        self._thread.join(timeout=2)
        self._socket.close()
        self.path.unlink(missing_ok=True)
