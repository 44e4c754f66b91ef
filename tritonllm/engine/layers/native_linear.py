"""The model's float32 linear layers on CPU, computed by the project's own kernels instead of the BLAS library's:
decode-sized inputs by kernels/dense_linear.cpp, prompt chunks by kernels/panel_gemm.cpp.

A decode step multiplies a few dozen rows by every weight matrix, so it streams all the weights from memory
each step and its speed is the speed at which it reads them. MKL's GEMV and small GEMMs dispatch by CPU
vendor, and on AMD's CPUs read the weights at half the native kernel's speed (bench/results/native_linear.md).
From 3 to 32 rows the native kernel is as fast as oneDNN with weights prepacked into its blocked layout, without
the second copy of the weights that prepacking keeps.

Past NATIVE_ROWS rows (prefill chunks) the work is bound by arithmetic, not memory, and a GEMM built for that
takes over, faster than MKL's SGEMM on these shapes (bench/results/log.md, "Prompts through a GEMM of our own").
The layer stays an nn.Linear with its own weight: LoRA, tensor parallel and the GGUF
swap see the same module. Results differ from stock only in summation order.
"""

from __future__ import annotations

import torch

from tritonllm.engine.kernels import cpu_kernels

NATIVE_ROWS = 64  # up to this many rows the native kernel is as fast or faster (AMD EPYC: 148-164 GFLOPS, MKL 127-136)
_NO_BIAS = torch.empty(0)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and cpu_kernels.native() is not None


class NativeLinear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()
        kernels = cpu_kernels.native()
        multiply = kernels.dense_linear if flat.shape[0] <= NATIVE_ROWS else kernels.panel_linear
        out = multiply(flat, self.weight, _NO_BIAS if self.bias is None else self.bias)
        return out.view(*x.shape[:-1], self.out_features)


def install(model: torch.nn.Module) -> int:
    """Makes the model's float32 nn.Linear layers NativeLinear ones, weights shared (a tied output layer stays
    tied); returns how many."""
    swapped = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.is_contiguous():
            module.__class__ = NativeLinear  # the same object: parameters, tying and references stay as they are
            swapped += 1
    return swapped
