"""Llama-family models (Llama, Mistral, Qwen2) built from their checkpoint without transformers' model code.

Importing transformers' modeling code costs an llm process some 130 MB and 2 s before any weight is read; for the
architectures that the native decoder stack (native_decode.py) serves whole, nothing of it runs at serving time:
the stack does every layer, and only the embedding lookup, the rotary tables, the final norm and the output layer
are the model's own. So these are built here as plain modules, under transformers' names (model.embed_tokens,
model.layers[i].self_attn.q_proj, ..., lm_head), so that the GGUF blocks, the fused projections, the native
linear layers and LoRA's wrappers replace their layers as they do a transformers model's; the steps the stack does
not take (a LoRA adapter's, the load check's probe) run this module's forward pass, transformers' Llama
operation for operation over the paged attention. The rotary frequencies come from
transformers' own rope functions, computed with the reference logits in a short-lived process
(reference_logits.py), so every rope type whose tables do not depend on the sequence's length applies as
transformers computes it. The model check compares this model's logits with transformers' on a probe prompt;
where they differ, the runner loads the model through transformers instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from safetensors import safe_open

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.layers.gguf_linear import GGUFEmbedding, GGUFLinear, check_kernels
from tritonllm.engine.layers.paged_attention import PagedBatch, paged_attention
from tritonllm.formats import gguf, gguf_weights
from tritonllm.formats.gguf_weights import FileTensor

# a checkpoint's weight: float32 values, or a GGUF file's tensor as the file holds it
Weight = torch.Tensor | FileTensor

ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})
# rope types whose tables transformers recomputes from the sequence's length (dynamic_rope_update)
LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})
# transformers' defaults for these architectures where config.json leaves a field out
DEFAULTS = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "pretraining_tp": 1}
# not transformers': a multimodal Qwen2-VL's M-RoPE sections, which formats/multimodal_folder.py writes into its
# language model's config (transformers' Qwen2 has no M-RoPE, and that config's text prompts need none)
DEFAULTS["mrope_section"] = None


class ModelConfig(SimpleNamespace):
    """config.json as attributes (the fields it leaves out: transformers' defaults for these architectures)."""

    @classmethod
    def read(cls, model_dir: Path) -> ModelConfig:
        return cls(**{**DEFAULTS, **json.loads((Path(model_dir) / "config.json").read_text())})

    def to_dict(self) -> dict:
        return dict(vars(self))

    @property
    def architecture(self) -> str:
        return (getattr(self, "architectures", None) or ["?"])[0]

    @property
    def rope_type(self) -> str:
        rope = getattr(self, "rope_parameters", None) or getattr(self, "rope_scaling", None) or {}
        return rope.get("rope_type") or rope.get("type") or "default"


def why_not(config: ModelConfig, model_dir: Path) -> str | None:
    """None when this module builds the model as transformers would and the native stack can serve all of it."""
    if config.architecture not in ARCHITECTURES:
        return f"{config.architecture} is not one of {sorted(ARCHITECTURES)}"
    if config.rope_type in LENGTH_DEPENDENT_ROPE:
        return f"rope type {config.rope_type!r} changes its tables with the sequence's length"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "a sliding window"
    if not _weight_files(model_dir) and gguf.source_file(model_dir) is None:
        return "no safetensors weights"
    return None


def serves_from_gguf(model_dir: Path) -> Path | None:
    """The GGUF file whose tensors this build reads in place: a folder that holds a GGUF file's config and tokenizer
    but no weights of its own (formats/gguf.py's light folders)."""
    return gguf.source_file(model_dir) if not _weight_files(model_dir) else None


class RMSNorm(torch.nn.Module):
    """transformers' Llama RMSNorm, operation for operation."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = _parameter(weight)
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon)).to(dtype)


class RotaryEmbedding(torch.nn.Module):
    """cos and sin of each position, from the frequencies and scaling transformers' rope function gave."""

    def __init__(
        self, inv_freq: torch.Tensor, attention_scaling: float, mrope_section: list[int] | None = None
    ) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.attention_scaling = attention_scaling
        # M-RoPE (Qwen2-VL): the frequencies split in sections turned by the temporal, height and width positions
        self.mrope_section = mrope_section

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [B, T]; or, with mrope_section, [3, B, T] (a token's three positions; a text token's equal)."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        if position_ids.dim() == 3:
            freqs = torch.cat([part[i % 3] for i, part in enumerate(freqs.split(self.mrope_section, dim=-1))], dim=-1)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class Attention(torch.nn.Module):
    """transformers' Llama attention over the engine's paged KV cache (paged_attention.py)."""

    def __init__(self, layer_idx: int, head_dim: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = head_dim
        self.scaling = head_dim**-0.5

    def forward(
        self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], paged_batch: PagedBatch
    ) -> torch.Tensor:
        shape = (*hidden.shape[:-1], -1, self.head_dim)
        query = self.q_proj(hidden).view(shape).transpose(1, 2)
        key = self.k_proj(hidden).view(shape).transpose(1, 2)
        value = self.v_proj(hidden).view(shape).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in rotary)
        query, key = query * cos + _rotate_half(query) * sin, key * cos + _rotate_half(key) * sin
        out, _ = paged_attention(self, query, key, value, None, scaling=self.scaling, paged_batch=paged_batch)
        return self.o_proj(out.reshape(*hidden.shape[:-1], -1).contiguous())


class MLP(torch.nn.Module):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(hidden)) * self.up_proj(hidden))


class DecoderLayer(torch.nn.Module):
    def forward(
        self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], paged_batch: PagedBatch
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rotary, paged_batch)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


@dataclass
class CausalLMOutput:
    logits: torch.Tensor


class LlamaModel(torch.nn.Module):
    """The causal LM's modules and weights under transformers' names. Steps run on the native decoder stack; those
    it does not take (a LoRA adapter's, the load check's probe) through forward(), transformers' Llama forward
    pass operation for operation."""

    def __init__(self, config: ModelConfig, weights: dict[str, Weight], rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.config = config
        self.architecture = config.architecture
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        inner = torch.nn.Module()
        inner.embed_tokens = _embedding(weights["model.embed_tokens.weight"])
        inner.layers = torch.nn.ModuleList()
        for i in range(config.num_hidden_layers):
            prefix = f"model.layers.{i}."
            layer = DecoderLayer()
            layer.self_attn = _projections(
                Attention(i, head_dim), weights, prefix + "self_attn.", ("q_proj", "k_proj", "v_proj", "o_proj")
            )
            layer.mlp = _projections(MLP(), weights, prefix + "mlp.", ("gate_proj", "up_proj", "down_proj"))
            layer.input_layernorm = RMSNorm(_values(weights[prefix + "input_layernorm.weight"]), config.rms_norm_eps)
            layer.post_attention_layernorm = RMSNorm(
                _values(weights[prefix + "post_attention_layernorm.weight"]), config.rms_norm_eps
            )
            inner.layers.append(layer)
        inner.norm = RMSNorm(_values(weights["model.norm.weight"]), config.rms_norm_eps)
        inner.rotary_emb = rotary
        self.model = inner
        if isinstance(weights["model.embed_tokens.weight"], FileTensor):
            # a GGUF file without output.weight ties the output layer to the embedding
            self.lm_head = _linear(weights.get("lm_head.weight", weights["model.embed_tokens.weight"]), None)
            return
        vocab, hidden = inner.embed_tokens.weight.shape
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False, device="meta")
        tied = config.tie_word_embeddings
        self.lm_head.weight = inner.embed_tokens.weight if tied else _parameter(weights["lm_head.weight"])

    @classmethod
    def load(cls, model_dir: Path, config: ModelConfig, rotary: RotaryEmbedding) -> LlamaModel:
        """float32 weights of the checkpoint (a float32 file's stay in its mapping until weight_memory copies them)."""
        weights = {}
        for file in _weight_files(model_dir):
            with safe_open(file, framework="pt") as f:
                weights.update({name: f.get_tensor(name).to(torch.float32) for name in f.keys()})
        gguf_file = serves_from_gguf(model_dir)
        if gguf_file is not None:
            try:
                weights = gguf_weights.read(gguf_file, config)
            except ValueError as e:
                raise UnsupportedModelError(str(e)) from e
            check_kernels(weights.values(), gguf_file)
        model = cls(config, weights, rotary)
        model.name_or_path = str(model_dir)
        return model.eval()

    def forward(
        self,
        position_ids: torch.Tensor,
        logits_to_keep: torch.Tensor,
        paged_batch: PagedBatch,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool = False,
    ) -> CausalLMOutput:
        """The logits of the packed batch's rows `logits_to_keep`, as the runner calls a transformers model."""
        inner = self.model
        hidden = inputs_embeds if inputs_embeds is not None else inner.embed_tokens(input_ids)
        rotary = inner.rotary_emb(hidden, position_ids)
        for layer in inner.layers:
            hidden = layer(hidden, rotary, paged_batch)
        return CausalLMOutput(self.lm_head(inner.norm(hidden)[:, logits_to_keep, :]))

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype


def _weight_files(model_dir: Path) -> list[Path]:
    return sorted(Path(model_dir).glob("*.safetensors"))


def _parameter(weight: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(weight, requires_grad=False)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _projections(
    block: torch.nn.Module, weights: dict[str, Weight], prefix: str, names: tuple[str, ...]
) -> torch.nn.Module:
    """`block` with its linear layers, each with the bias its checkpoint has (Qwen2's q/k/v, attention_bias,
    mlp_bias)."""
    for name in names:
        bias = weights.get(f"{prefix}{name}.bias")
        setattr(block, name, _linear(weights[f"{prefix}{name}.weight"], None if bias is None else _values(bias)))
    return block


def _linear(weight: Weight, bias: torch.Tensor | None) -> torch.nn.Module:
    if isinstance(weight, FileTensor):
        return GGUFLinear(weight.raw, weight.type, weight.shape[1], bias)
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = _parameter(weight)
    if bias is not None:
        layer.bias = _parameter(bias)
    return layer


def _embedding(weight: Weight) -> torch.nn.Module:
    if isinstance(weight, FileTensor):
        return GGUFEmbedding(weight.raw, weight.type, weight.shape[1])
    return torch.nn.Embedding.from_pretrained(weight, freeze=True)


def _values(weight: Weight) -> torch.Tensor:
    return weight.values() if isinstance(weight, FileTensor) else weight
