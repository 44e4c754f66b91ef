"""The decode step's matmuls alone: SmolLM2-135M's 211 weight matrices (30 layers of q, k, v, o, gate, up,
down, then the 49152 x 576 output layer) multiplied by M rows, as stock torch (MKL), as oneDNN with the weights
prepacked into its blocked layout, and as the engine's native kernel (kernels/dense_linear.cpp). The three take
turns, each round in the same process, and each keeps its median; the machine's CPU and instruction sets are
recorded with it.

    .venv/bin/python bench/native_linear.py     # writes bench/results/native_linear.md
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from run import RESULTS, machine

from tritonllm.engine.kernels import cpu_kernels

ROWS = (1, 2, 4, 8, 16, 32, 48, 64)
ROUNDS = 7
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30
SHAPES.append((49152, 576))


def median_ms(run) -> float:
    run()
    times = []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def main() -> None:
    kernels = cpu_kernels.build()
    torch.manual_seed(0)
    weights = [torch.randn(shape) for shape in SHAPES]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights]
    no_bias = torch.empty(0)
    gigabytes = sum(w.numel() for w in weights) * 4 / 1e9
    lines = []
    for rows in ROWS:
        inputs = {k: torch.randn(rows, k) for k in (576, 1536)}
        cases = {
            "torch F.linear (MKL)": lambda x=inputs: [F.linear(x[w.shape[1]], w) for w in weights],
            "oneDNN, prepacked": lambda x=inputs: [
                torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], p, None, "none", [], "")
                for w, p in zip(weights, packed, strict=True)
            ],
            "native kernel": lambda x=inputs: [kernels.dense_linear(x[w.shape[1]], w, no_bias) for w in weights],
        }
        times = {name: median_ms(run) for name, run in cases.items()}
        best_peer = min(times["torch F.linear (MKL)"], times["oneDNN, prepacked"])
        native = times["native kernel"]
        cells = " | ".join(f"{t:.1f}" for t in times.values())
        lines.append(f"| {rows} | {cells} | {gigabytes / native * 1e3:.1f} | {best_peer / native:.2f} |")
        print(lines[-1], flush=True)
    report = [
        "# The decode step's matmuls on SmolLM2-135M's shapes: MKL, oneDNN prepacked, the native kernel",
        "",
        f"Command: `.venv/bin/python bench/native_linear.py`. Machine: `{machine()}`.",
        f"All 211 matrices ({gigabytes:.2f} GB of float32) times M rows; the median of {ROUNDS} rounds, ms.",
        "",
        "| rows | torch F.linear (MKL) | oneDNN, prepacked | native kernel | native GB/s | best other ÷ native |",
        "|---|---|---|---|---|---|",
        *lines,
        "",
    ]
    (RESULTS / "native_linear.md").write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
