"""How close one request's decode runs to the machine's memory limit: the bytes a token reads from a GGUF file's
weights, times tokens/s, over the machine's measured read bandwidth on every core.

A decode step of one sequence reads every weight once (the embedding only a row of it, unless the output layer is
tied to it and reads it whole), so at one request tokens/s can be no higher than bandwidth ÷ those bytes.

    .venv/bin/python bench/memory_limit.py FILE.gguf
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from tritonllm.formats import gguf

EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"


def bytes_read_a_token(model: Path) -> int:
    """The weight bytes one decode step of one sequence reads: every tensor but an untied embedding table (of a HF
    folder, every safetensors file: the real-size folders are tied)."""
    if model.is_dir():
        return sum(part.stat().st_size for part in model.glob("*.safetensors"))
    _, tensors = gguf.read_tensors(model)
    names = {t.name for t in tensors}
    untied = OUTPUT in names
    return sum(t.data.nbytes for t in tensors if not (untied and t.name == EMBEDDING))


def read_bandwidth(gib: float = 1.0, repeats: int = 7) -> float:
    """Bytes a second torch's threads read from memory: the median over `repeats` sums of a float32 buffer far larger
    than the caches (torch's vectorized float32 sum runs at the memory's pace; its int32 sum does not)."""
    import torch

    buffer = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    buffer.sum()  # the pages are touched before any time is taken
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - began)
    return buffer.numel() * 4 / statistics.median(times)


def fraction(tokens_per_s: float, file: Path, bandwidth: float) -> float:
    """The share of the memory limit one request's tokens/s reaches."""
    return tokens_per_s * bytes_read_a_token(file) / bandwidth


if __name__ == "__main__":
    bandwidth = read_bandwidth()
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s")
    for name in sys.argv[1:]:
        read = bytes_read_a_token(Path(name))
        print(f"{name}: {read / 2**20:.0f} MiB a token, limit {bandwidth / read:.1f} tokens/s")
