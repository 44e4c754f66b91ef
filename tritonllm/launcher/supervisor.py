"""Keeps `serve`'s tritonserver whole: when a model's process or the server itself dies, the server is restarted.

tritonserver 2.51 does not recover from a Python model's stub that dies (killed, or out of memory): the requests
it held never end, so their streams hang; every later request to the model is refused ("Stub process 'llm_0_0'
is not healthy"); and /v2/health/ready still answers 200, so a probe keeps the broken server in service. The
supervisor looks at the server's processes every second; when one is gone it says so (`unavailable`, which the
shim's /health and routes answer with a 503 and the reason), ends the server at once (its streams then end with
an error instead of hanging), starts it again on the same ports, and is available again once it is ready.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tritonllm.launcher.tritonserver import ServerError, TritonServer

RETRY_S = 5.0  # between starts that fail


class Supervisor:
    def __init__(self, server: TritonServer, say: Callable[[str], None], interval: float = 1.0) -> None:
        self.server = server
        self.say = say
        self.interval = interval
        self.unavailable: str | None = None  # why the server cannot serve right now
        self.restarts = 0
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tritonserver-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        self._closing.set()
        if self._thread.is_alive():  # a server that never started was never watched
            self._thread.join(timeout)

    def wait(self) -> None:
        """Blocks until closed (the `--no-shim` serve's main thread, which has nothing else to do)."""
        self._closing.wait()

    def _watch(self) -> None:
        while not self._closing.wait(self.interval):
            dead = self.server.dead_parts()
            if dead:
                self._restart(f"{', '.join(dead)} died")

    def _restart(self, reason: str) -> None:
        self.unavailable = f"{reason}; tritonserver is restarting"
        self.say(self.unavailable)
        self.server.stop(timeout=0)  # what the dead part held cannot finish: nothing to wait for
        while not self._closing.is_set():
            try:
                self.server.start()
                break
            except ServerError as e:
                self.say(f"tritonserver did not start again: {e}")
                self._closing.wait(RETRY_S)
        else:
            return
        self.restarts += 1
        self.unavailable = None
        self.say(f"tritonserver restarted ({self.restarts} restart(s) so far)")
