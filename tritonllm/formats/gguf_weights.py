"""A GGUF file's tensors as they lie in the file, under its own names (`in_file`: engine/models/gguf_model.py places
them in transformers' modules) or under transformers' names for the engine's Llama-family build (`read`:
engine/models/llama_model.py); either serves them from the mapping, in the file's own block types, with no float32 copy.

llama.cpp's converter stores Llama's q and k projections with their rows permuted (its rotary embedding pairs
neighbouring values, transformers' pairs the two halves of a head); those rows are put back in transformers' order,
a copy of their blocks, so that the rotary embedding is transformers'. Every other tensor stays in the mapping
(copy-on-write: the engine never writes it, and the pages are the page cache's, shared between processes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tritonllm.formats import gguf

ARCHITECTURES = gguf.LLAMA_FAMILY
# architectures whose converter permutes the q and k rows (convert_hf_to_gguf.py's LlamaModel.permute)
PERMUTED_QK = frozenset({"llama"})

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class FileTensor:
    """One tensor as the file holds it: `raw` its rows' bytes, uint8 [rows, bytes per row] (a 1-D tensor: [1, bytes]),
    `type` ggml's type id, `shape` transformers' [out, in] (or [n] for a vector)."""

    raw: torch.Tensor
    type_name: str
    type: int
    shape: tuple[int, ...]

    def values(self) -> torch.Tensor:
        """A float32 copy of a plain (F32, F16, BF16) tensor: the norms and biases, a few KB each."""
        import gguf as gguf_py

        flat = gguf_py.quants.dequantize(self.raw.numpy(), gguf_py.GGMLQuantizationType[self.type_name])
        return torch.from_numpy(np.ascontiguousarray(flat, dtype=np.float32)).reshape(self.shape)


def hf_name(name: str) -> str | None:
    """transformers' name for a tensor of the file; None for one the Llama family does not have."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    match = _LAYER_NAME.fullmatch(name)
    if match is None or match[2] not in _LAYER:
        return None
    return f"model.layers.{match[1]}.{_LAYER[match[2]]}.{match[3]}"


def in_file(gguf_file: Path) -> tuple[str, dict[str, FileTensor]]:
    """The file's architecture and its tensors under the file's own names, as the file holds them (mapped)."""
    from gguf import GGMLQuantizationType

    architecture, tensors = gguf.read_tensors(gguf_file, mode="c")
    out = {}
    for tensor in tensors:
        data = tensor.data
        rows = data.reshape(-1, data.shape[-1]).view(np.uint8)
        shape = tuple(data.shape[:-1]) + (gguf.values_of(tensor) // rows.shape[0],)
        kind = GGMLQuantizationType[tensor.type_name].value
        out[tensor.name] = FileTensor(torch.from_numpy(rows), tensor.type_name, kind, shape)
    return architecture, out


def read(gguf_file: Path, config) -> dict[str, FileTensor]:
    """The file's tensors under transformers' names. Raises ValueError naming a tensor the build does not know,
    or an architecture it does not serve."""
    architecture, tensors = in_file(gguf_file)
    if architecture not in ARCHITECTURES:
        raise ValueError(f"GGUF architecture {architecture!r} is not one of {sorted(ARCHITECTURES)}")
    out = {}
    for file_name, tensor in tensors.items():
        name = hf_name(file_name)
        if name is None:
            raise ValueError(f"{gguf_file.name}: tensor {file_name!r} has no place in a {architecture} model")
        if architecture in PERMUTED_QK and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            raw = tensor.raw[torch.from_numpy(unpermuted_rows(tensor.raw.shape[0], heads))].contiguous()
            tensor = FileTensor(raw, tensor.type_name, tensor.type, tensor.shape)
        out[name] = tensor
    return out


def unpermuted_rows(rows: int, heads: int) -> np.ndarray:
    """Which of the file's rows is each of transformers' rows: the inverse of llama.cpp's permute, which stores
    head h's row pairs (i, i + half) as neighbours (transformers' reverse_permute, as a row order)."""
    order = np.arange(rows)
    return order.reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(rows)
