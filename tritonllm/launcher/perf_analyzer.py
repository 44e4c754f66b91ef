"""Provides a `perf_analyzer` that runs on this machine.

perf_analyzer from tritonclient 2.52 and later needs glibc 2.38; the one in the tritonclient 2.48.0 wheel runs
on glibc 2.36. It is taken out of that wheel (downloaded, not installed, so the project keeps its newer
tritonclient library) and given the two libraries it misses, both carried by the nvidia-pytriton wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tritonllm.launcher.tritonserver import library_dirs

WHEEL = "tritonclient==2.48.0"
MEMBER = "tritonclient-2.48.0.data/data/bin/perf_analyzer"
NEEDED = {"libcudart.so.12": "libcudart-", "libb64.so.0d": "libb64-"}


def install_dir() -> Path:
    return Path(sys.prefix) / "perf_analyzer"


def binary() -> Path:
    return install_dir() / "perf_analyzer"


def ensure_installed() -> Path:
    target = binary()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", WHEEL, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("tritonclient-2.48.0-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            target.write_bytes(zf.read(MEMBER))
    target.chmod(0o755)
    bundled = Path(library_dirs()[0])
    for name, prefix in NEEDED.items():
        link = target.parent / name
        if not link.exists():
            link.symlink_to(next(bundled.glob(f"{prefix}*.so*")))
    return target


def run(args: list[str]) -> int:
    exe = ensure_installed()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(exe.parent), *library_dirs(), env.get("LD_LIBRARY_PATH", "")])
    return subprocess.call([str(exe), *args], env=env)
