"""The model's larger Linear layers with a copy of their weights reordered, at load, into oneDNN's blocked layout.

A decode step multiplies a few dozen rows by every weight matrix, so it streams all the weights from memory each
step. Stock `nn.Linear` hands MKL a row-major [out, in] weight that it re-blocks on every call; the prepacked
copy is read as stored. On this machine the 57 matrices of the small demo model at 32 rows take 25 ms this way
against 42 ms stock, and the whole W1 decode step 57 ms against 70. Any row count works (MKL's own packed GEMM
is as fast only at the exact row count it was packed for). Float32 results differ from stock only in
summation order.

oneDNN costs some 30 us more per call, though, so a few rows (one sequence decoding) and small matrices (the
tiny demo model) stay on the stock path, which keeps the original weight; the packed copy doubles the memory
of the layers that have one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ROWS_HINT = 64  # steers the block format only; any number of rows is accepted
MIN_ROWS = 16  # fewer rows: the stock path is as fast or faster
MIN_WEIGHT_ELEMENTS = 1 << 18  # matrices under 512 x 512 never gain


def available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PrepackedLinear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < MIN_ROWS * self.in_features:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def prepack(model: torch.nn.Module) -> None:
    """Swaps the model's large nn.Linear layers for PrepackedLinear ones."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.numel() >= MIN_WEIGHT_ELEMENTS:
                setattr(parent, name, PrepackedLinear(child))
