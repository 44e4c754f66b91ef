"""Linear layers and the input embedding over a GGUF file's weights in the file's own block types, read where the
file is mapped (kernels/gguf_linear.cpp): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
IQ4_XS, F16, BF16 and F32. Each value is widened to float32 as gguf-py dequantizes it and multiplied with float32
inputs, so a layer's product equals the dequantized weight's up to the order of summation.

The raw rows are held as a plain attribute, not a buffer: weight_memory copies every buffer that lies in a mapped
file into anonymous memory, and these are meant to stay in the file's pages.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers.quantized_linear import GEMM_ROWS

_NO_BIAS = torch.empty(0)


def kernel_types() -> frozenset[int]:
    """The ggml type ids with a kernel in this build."""
    native = cpu_kernels.native()
    if native is None:
        return frozenset()
    return frozenset(t for t in range(64) if native.gguf_block_values(t) > 0)


def check_kernels(tensors: Iterable, gguf_file: Path) -> None:
    """Refuses a file with a matrix (a FileTensor of two dimensions) in a type no kernel here reads: it would have
    to be widened to float32."""
    served = kernel_types()
    missing = sorted({t.type_name for t in tensors if len(t.shape) == 2 and t.type not in served})
    if missing:
        why = "the native kernels are not built" if not served else f"no kernel here reads GGUF type(s) {missing}"
        raise UnsupportedModelError(f"{gguf_file.name} cannot be served from its blocks: {why}")


class GGUFLinear(torch.nn.Module):
    def __init__(self, raw: torch.Tensor, ggml_type: int, in_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.raw = raw  # uint8 [out_features, bytes per row], the file's rows
        self.ggml_type = ggml_type
        self.in_features, self.out_features = in_features, raw.shape[0]
        self.register_buffer("bias", None if bias is None else bias.detach())

    @property
    def type_name(self) -> str:
        """ggml's name of the weight's type (Q4_K, ...)."""
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.ggml_type).name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()
        bias = _NO_BIAS if self.bias is None else self.bias
        out = cpu_kernels.native().gguf_linear(flat, self.raw, self.ggml_type, bias, GEMM_ROWS)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, ggml_type={self.ggml_type}"


class GGUFEmbedding(torch.nn.Module):
    """An input embedding in the file's blocks: a step widens only its tokens' rows."""

    def __init__(self, raw: torch.Tensor, ggml_type: int, embedding_dim: int) -> None:
        super().__init__()
        self.raw = raw
        self.ggml_type = ggml_type
        self.num_embeddings, self.embedding_dim = raw.shape[0], embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.raw.index_select(0, ids.reshape(-1))
        table = cpu_kernels.native().gguf_dequantize(rows, self.ggml_type, self.embedding_dim)
        return table.view(*ids.shape, self.embedding_dim)
