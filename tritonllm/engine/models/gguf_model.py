"""A GGUF file of an architecture the engine's Llama-family build does not take (Qwen3, Gemma 2 and 3, Phi-3),
served from the file through transformers' own modules: the model is built from its config with no weights (on
the meta device), then every linear layer and the input embedding become the file's rows in their own block type
(gguf_linear.py), read where the file is mapped, and only the small tensors (norms, biases) are copied out as
float32. No float32 copy of a matrix exists at any point, the load included.

transformers' own GGUF support names the places: its map from the file's tensor names to the model's
(`get_gguf_hf_weights_map`) and its per-architecture processing of the values (Gemma's norms are stored plus one
by llama.cpp's converter); the processing is applied to the copied tensors only, and an architecture whose
processing would change a matrix (Llama's q/k row order, handled by the Llama-family build) is not served here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.layers.gguf_linear import GGUFEmbedding, GGUFLinear, check_kernels
from tritonllm.engine.models.gguf_swap import replace_module
from tritonllm.formats import gguf, gguf_weights
from tritonllm.formats.gguf_weights import FileTensor


class ScaledGGUFEmbedding(GGUFEmbedding):
    """Gemma's input embedding: the rows times sqrt(hidden size), as its ScaledWordEmbedding multiplies them (a
    float32 scalar tensor, so the same bits)."""

    def __init__(self, raw: torch.Tensor, ggml_type: int, embedding_dim: int, scale: float) -> None:
        super().__init__(raw, ggml_type, embedding_dim)
        self.scale = torch.tensor(scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * self.scale


def build(model_dir: Path, gguf_file: Path, attn_implementation: str) -> torch.nn.Module:
    """transformers' model of the folder's config with the file's tensors in it."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    architecture, tensors = gguf_weights.in_file(gguf_file)
    if architecture not in gguf.THROUGH_TRANSFORMERS:
        raise UnsupportedModelError(f"{gguf_file.name}: architecture {architecture!r} is not served this way")
    check_kernels(tensors.values(), gguf_file)
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    places = get_gguf_hf_weights_map(model, processor)
    unplaced = sorted(set(tensors) - set(places))
    if unplaced:
        raise UnsupportedModelError(f"{gguf_file.name}: tensors {unplaced[:4]} have no place in {type(model).__name__}")
    by_name = {places[name]: (name, tensor) for name, tensor in tensors.items()}
    for name, (file_name, tensor) in by_name.items():
        module_name, kind = name.rsplit(".", 1)
        module = model.get_submodule(module_name)
        if isinstance(module, torch.nn.Linear) and kind == "weight":
            bias = by_name.get(f"{module_name}.bias")
            bias_values = None if bias is None else _values(processor, *bias)
            replace_module(model, module_name, GGUFLinear(tensor.raw, tensor.type, tensor.shape[1], bias_values))
        elif isinstance(module, torch.nn.Embedding) and kind == "weight":
            replace_module(model, module_name, _embedding(module, tensor))
        elif not (kind == "bias" and isinstance(module, torch.nn.Linear | GGUFLinear)):  # a bias: with its weight
            module._parameters[kind] = torch.nn.Parameter(_values(processor, file_name, tensor), requires_grad=False)
    _tie_output_layer(model, config)
    _compute_buffers(model)
    left = [name for name, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if left:
        raise UnsupportedModelError(f"{gguf_file.name} has no tensor for {left[:4]} of {type(model).__name__}")
    model.name_or_path = str(model_dir)
    return model.eval()


def _values(processor, file_name: str, tensor: FileTensor) -> torch.Tensor:
    """A small tensor's float32 values as transformers' GGUF loader gives them (after its processing)."""
    processed = processor.process(weights=tensor.values().numpy(), name=file_name).weights
    return torch.from_numpy(processed).reshape(tensor.shape).contiguous()


def _embedding(module: torch.nn.Embedding, tensor: FileTensor) -> GGUFEmbedding:
    scale = getattr(module, "scalar_embed_scale", None)  # Gemma's ScaledWordEmbedding
    if scale is None:
        return GGUFEmbedding(tensor.raw, tensor.type, tensor.shape[1])
    return ScaledGGUFEmbedding(tensor.raw, tensor.type, tensor.shape[1], scale)


def _tie_output_layer(model: torch.nn.Module, config) -> None:
    """A tied output layer (no output.weight in the file) reads the input embedding's rows."""
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and head.weight.is_meta and config.get_text_config().tie_word_embeddings:
        embedding = model.get_input_embeddings()
        head_name = next(name for name, m in model.named_modules() if m is head)
        replace_module(model, head_name, GGUFLinear(embedding.raw, embedding.ggml_type, embedding.embedding_dim, None))


def _compute_buffers(model: torch.nn.Module) -> None:
    """The rotary embeddings' tables, which the meta device left without values: built again from the config."""
    for name, module in list(model.named_modules()):
        if any(b.is_meta for b in module.buffers(recurse=False)) and type(module).__name__.endswith("RotaryEmbedding"):
            replace_module(model, name, type(module)(config=module.config))
