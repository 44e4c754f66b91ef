"""Tells a decoupled model that Triton has begun to stop it, and by when its work must end. Imported only inside
Triton's Python backend.

Triton unloads a model only once every response factory of its requests is released, and a decoupled Python model
releases one only with the request's final response. A stop (SIGINT or SIGTERM, or an unload through model control)
refuses new requests, lets those in flight finish, unloads, and past `--exit-timeout-secs` exits with the stubs
still running (then killed). Nothing reaches the model in between: `finalize()` comes after the unload, which a
generation still streaming or a channel held open (a client's multiplexed channel) holds off for good. So the model
asks whether it is still ready, over the server's own HTTP endpoint found on tritonserver's command line:

- 200 while it is; an error status once the model is unloading;
- the connection refused once the server is stopping: tritonserver 2.51 closes its HTTP endpoint first (main.cc,
  StopEndpoints before TRITONSERVER_ServerStop), while the gRPC streams stay open until the models have unloaded.

Not through `pb_utils.is_model_ready`: in Triton 2.51 the stub reads the error of a failed utility call after the
server has freed it (ProcessMessage), and one such call made while the server exits crashes the stub.
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger(__name__)

DEFAULT_HTTP_PORT = 8000
DEFAULT_EXIT_TIMEOUT_S = 30
STARTING_INTERVAL_S = 0.05
UNLOAD_MARGIN_S = 3.0  # of the exit timeout, left for the model to end its work and unload


def server_flags(command_line: list[str]) -> dict[str, str]:
    """tritonserver's `--name=value` and `--name value` flags."""
    flags: dict[str, str] = {}
    args = iter(command_line[1:])
    for arg in args:
        if arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            flags[name] = value if equals else next(args, "")
    return flags


def http_address(flags: dict[str, str]) -> tuple[str, int] | None:
    """Where tritonserver's HTTP endpoint listens; None where HTTP is off."""
    if flags.get("allow-http", "true").lower() in ("false", "0", "off", "no"):
        return None
    host = flags.get("http-address", "0.0.0.0").strip("[]")
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), int(flags.get("http-port", DEFAULT_HTTP_PORT))


class UnloadWatch:
    """Calls `on_unloading(deadline)` once, on a thread of its own, when the server no longer counts the model ready
    after it did; `deadline` (time.monotonic()) is when the server's exit timeout runs out, less a margin for the
    unload itself. Readiness is read every `interval_s` seconds, one HTTP request."""

    def __init__(
        self, model_name: str, model_version: str, on_unloading: Callable[[float], None], interval_s: float = 0.5
    ) -> None:
        self._path = f"/v2/models/{quote(model_name)}/versions/{quote(model_version)}/ready"
        self._on_unloading = on_unloading
        self._interval_s = interval_s
        self._closed = threading.Event()
        flags = server_flags(Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0"))
        self._address = http_address(flags)
        self._exit_timeout_s = float(flags.get("exit-timeout-secs", DEFAULT_EXIT_TIMEOUT_S))
        self._thread = threading.Thread(target=self._run, name="unload-watch", daemon=True)
        if self._address is None:
            log.warning("%s: tritonserver serves no HTTP, so its stop is not seen before the unload", model_name)
        else:
            self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        # The server refuses connections, and the model is not ready, while the models load: until it has been seen
        # ready, readiness is read often, for a stop soon after the start to be seen as one.
        seen_ready = False
        while not self._closed.wait(self._interval_s if seen_ready else STARTING_INTERVAL_S):
            ready = self._ready()
            if ready:
                seen_ready = True
            elif ready is False and seen_ready:
                started = time.monotonic()
                log.warning("%s: the server stops or unloads the model", self._path)
                self._on_unloading(started + max(0.0, self._exit_timeout_s - UNLOAD_MARGIN_S))
                return

    def _ready(self) -> bool | None:
        """The server's answer; False where it refuses the connection (it is stopping); None where no answer came
        (it is busy). A connection of its own each time: tritonserver's HTTP endpoint waits for the connections
        open at a stop, so a kept one would hold the stop up for the whole exit timeout."""
        connection = http.client.HTTPConnection(*self._address, timeout=5)
        try:
            connection.request("GET", self._path, headers={"Connection": "close"})
            response = connection.getresponse()
            response.read()
        except ConnectionRefusedError:
            return False
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()
        return response.status == 200
