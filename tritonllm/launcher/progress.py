"""The launcher's lines to the person at the terminal, on stderr."""

from __future__ import annotations

import sys


def progress(message: str) -> None:
    print(f"[tritonllm] {message}", file=sys.stderr, flush=True)
