"""What a compile of the native kernels has done so far, told every few seconds while it runs: torch's builder
prints nothing until it ends, and a first build takes minutes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path


class KernelBuildProgress:
    """While entered, tells `progress` every `interval` seconds how many of the `total` sources have been compiled
    into `build_dir` (ninja's object files written since the build began). A build that only loads the cached
    module ends before the first tell, and so says nothing."""

    def __init__(self, build_dir: Path, total: int, progress: Callable[[str], None], interval: float = 15.0) -> None:
        self.build_dir, self.total, self.progress, self.interval = build_dir, total, progress, interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tell, name="kernel-build-progress", daemon=True)
        self.started = 0.0

    def compiled(self) -> int:
        """The object files written since the build began (a second's slack: a file's time is the kernel's coarser
        clock, which can lag time.time())."""
        return sum(1 for o in self.build_dir.glob("*.o") if o.stat().st_mtime >= self.started - 1)

    def __enter__(self) -> KernelBuildProgress:
        self.started = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _tell(self) -> None:
        while not self._done.wait(self.interval):
            elapsed = time.time() - self.started
            self.progress(f"compiling the native CPU kernels: {self.compiled()}/{self.total} sources, {elapsed:.0f} s")
