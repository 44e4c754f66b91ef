"""This environment's Python interpreter, for the child processes a model starts."""

from __future__ import annotations

import sys
from pathlib import Path


def python_executable() -> str:
    """Inside Triton's Python backend, sys.executable is the backend's stub, not Python."""
    candidate = Path(sys.prefix) / "bin" / "python3"
    return str(candidate) if candidate.exists() else sys.executable
