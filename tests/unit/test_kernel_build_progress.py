"""The native kernels' compile tells how far it has got while it runs, and a load of the cached build says
nothing more."""

from __future__ import annotations

import os
import time

from tritonllm.engine.kernels.kernel_build_progress import KernelBuildProgress


def test_a_compile_is_told_by_the_sources_compiled_so_far(tmp_path):
    old = tmp_path / "stale.o"
    old.write_bytes(b"")
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # an earlier build's object is not this one's work
    lines: list[str] = []
    with KernelBuildProgress(tmp_path, 10, lines.append, interval=0.05):
        for name in ("a.o", "b.o", "c.o"):
            (tmp_path / name).write_bytes(b"")
        deadline = time.monotonic() + 10
        while not any("3/10" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert any(line.startswith("compiling the native CPU kernels: 3/10 sources, ") for line in lines)
    assert not any("4/10" in line for line in lines)


def test_a_build_that_ends_at_once_says_nothing(tmp_path):
    lines: list[str] = []
    with KernelBuildProgress(tmp_path, 10, lines.append, interval=5):
        pass
    assert lines == []
