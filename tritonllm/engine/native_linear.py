"""The model's float32 linear layers on CPU, computed by the project's own kernels instead of the BLAS library's:
decode-sized inputs by kernels/dense_linear.cpp, prompt chunks by kernels/panel_gemm.cpp.

A decode step multiplies a few dozen rows by every weight matrix, so it streams all the weights from memory
each step and its speed is the speed at which it reads them. MKL's GEMV and small GEMMs dispatch by CPU
vendor: on a 2-core AMD EPYC (AVX2) they read SmolLM2's weights at 9 GB/s for one row, where the native kernel
reads them at 19 GB/s (25 GB/s is that machine's limit), and the whole decode step's matmuls for one sequence
take 28.5 ms against 59.4 (bench/results/native_linear.md). From 3 to 32 rows it is as fast as oneDNN with
weights prepacked into its blocked layout, without the second copy of the weights that prepacking keeps.

Past NATIVE_ROWS rows (prefill chunks) the work is bound by arithmetic, not memory, and a GEMM built for that
takes over: on SmolLM2's shapes (2-core AMD EPYC Zen 4, the 30 layers' matrices one after another) it reaches
171-209 GFLOPS from 96 to 2048 rows where MKL's SGEMM reaches 107-188, and a 32-prompt burst's 2048-token step
took 2.31 s against 2.55. The layer stays an nn.Linear with its own weight: LoRA, tensor parallel and the GGUF
swap see the same module. Results differ from stock only in summation order.
"""

from __future__ import annotations

import torch

from tritonllm.engine import cpu_kernels

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
