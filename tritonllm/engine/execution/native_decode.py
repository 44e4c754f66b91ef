"""Steps of Llama-family models through one native call for the whole decoder stack
(kernels/decoder_layers.cpp), instead of transformers' per-module Python.

For one sequence on a 2-core CPU, SmolLM2's decode step spends about a third of its time outside the matmuls:
some 2,000 small tensor ops and 300 module calls, each a few microseconds of Python and dispatch; a step that
carries a prompt chunk pays some 50 ms of it whatever the chunk's size. The native stack does the same arithmetic
in one call, for every fed token of the step (each a query row that sees its own sequence's cache up to its own
position, so decodes and prompt chunks go together); the embedding lookup, the rotary tables (the model's own
rotary module, so every rope scaling it knows applies), the final norm and the output layer stay the model's.

It serves only what it computes exactly as transformers does: the architectures named in ARCHITECTURES, on CPU
in float32, with float32 weights (the q/k/v and gate/up projections fused, fused_projections.py) or GGUF blocks
(quantized_linear.py, or a GGUF file's own, gguf_linear.py), no sliding window, and SiLU; a step with anything
else (a LoRA adapter, the load-time probe) goes through transformers. At load, the model check runs a prefill and
a decode step both ways and keeps the native stack only when the logits agree to float32's rounding.
"""

from __future__ import annotations

import logging

import torch

from tritonllm.engine.decoding.greedy_screen import GreedyScreen
from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers import quantized_linear
from tritonllm.engine.layers.fused_projections import SiblingLinear
from tritonllm.engine.layers.gguf_linear import GGUFLinear
from tritonllm.engine.layers.lora import LoraLinear
from tritonllm.engine.layers.native_linear import NATIVE_ROWS, NativeLinear
from tritonllm.engine.layers.paged_attention import KVCache
from tritonllm.engine.layers.quantized_linear import GEMM_ROWS, QuantizedLinear
from tritonllm.engine.models.llama_model import ARCHITECTURES

log = logging.getLogger(__name__)

NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "RMSNorm"})
PROJECTIONS = (SiblingLinear, NativeLinear, QuantizedLinear, GGUFLinear)
_NO_BIAS = torch.empty(0)


def why_not(model: torch.nn.Module) -> str | None:
    """None when the native stack computes this (loaded, fused) model's decoder layers exactly; else the reason."""
    name = getattr(model, "architecture", type(model).__name__)  # llama_model's, or transformers' class
    if name not in ARCHITECTURES:
        return f"{name} is not one of {sorted(ARCHITECTURES)}"
    config = model.config
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)!r} (only silu)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if getattr(config, "sliding_window", None) and set(getattr(config, "layer_types", None) or ["?"]) != {
        "full_attention"
    }:
        return f"a sliding window of {config.sliding_window} tokens"
    for index, layer in enumerate(model.model.layers):
        attention, mlp = _Unwrapped(layer.self_attn), _Unwrapped(layer.mlp)
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if any(type(n).__name__ not in NORMS for n in norms):
            return f"layer {index}'s norms are not RMSNorm"
        projections = [getattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projections += [getattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(type(p) in PROJECTIONS for p in projections):
            return f"layer {index} has projections other than float32 or GGUF-block linear layers"
    return None


class NativeDecode:
    """The model's decoder stack as one native object, weights and KV cache shared, not copied."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, screen: bool = False):
        self.model = model
        serves = screen and GreedyScreen.serves(model.lm_head)
        self.screen = GreedyScreen(model.lm_head.weight) if serves else None
        layers = model.model.layers
        attentions = [_Unwrapped(layer.self_attn) for layer in layers]
        mlps = [_Unwrapped(layer.mlp) for layer in layers]
        stack = cpu_kernels.native().DecoderLayers()
        stack.input_norm = [layer.input_layernorm.weight.detach() for layer in layers]
        stack.post_norm = [layer.post_attention_layernorm.weight.detach() for layer in layers]
        stack.qkv = [_side_by_side(a.q_proj, a.k_proj, a.v_proj) for a in attentions]
        stack.o = [_projection(a.o_proj) for a in attentions]
        stack.gate_up = [_side_by_side(m.gate_proj, m.up_proj) for m in mlps]
        stack.down = [_projection(m.down_proj) for m in mlps]
        attention = layers[0].self_attn
        stack.k_cache, stack.v_cache = list(cache.key), list(cache.value)
        stack.k_scales, stack.v_scales = list(cache.key_scale), list(cache.value_scale)
        stack.dim = attention.head_dim
        stack.heads = model.config.num_attention_heads
        stack.kv_heads = getattr(model.config, "num_key_value_heads", None) or stack.heads
        stack.eps = layers[0].input_layernorm.variance_epsilon
        stack.scale = attention.scaling
        stack.gemm_rows = (NATIVE_ROWS, GEMM_ROWS)  # where each kind of projection turns to the prompt GEMM
        self.stack = stack

    def logits(
        self,
        inputs: dict[str, torch.Tensor],
        position_ids: torch.Tensor,
        slots: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        keep: torch.Tensor,
        screened: bool = False,
    ) -> torch.Tensor:
        """float32 logits of the rows `keep` of the step's fed tokens (`inputs`: input_ids [1, T], or inputs_embeds
        [1, T, hidden] where a prompt table gives rows; position_ids [1, T]); each token's row of block_tables
        [T, max_blocks] is its sequence's, context_lens [T] its position + 1. `screened`: the rows want only their
        argmax (greedy_screen.py)."""
        inner = self.model.model
        hidden = inputs["inputs_embeds"] if "inputs_embeds" in inputs else inner.embed_tokens(inputs["input_ids"])
        cos, sin = inner.rotary_emb(hidden, position_ids)
        out = self.stack.forward(hidden[0], cos[0].contiguous(), sin[0].contiguous(), slots, block_tables, context_lens)
        hidden = inner.norm(out)[keep]
        return self.screen.logits(hidden) if screened else self.model.lm_head(hidden)


class _Unwrapped:
    """A module's projections as the model loaded them, seen through the LoRA wrappers (the native stack runs
    only steps without adapters)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __getattr__(self, name: str):
        child = getattr(self.module, name)
        return child.base if isinstance(child, LoraLinear) else child


def _side_by_side(*siblings: torch.nn.Module) -> list:
    """The projections whose outputs the stack puts side by side: one fused layer where they can be one."""
    if type(siblings[0]) is SiblingLinear:
        return [_projection(siblings[0].fused.layer)]
    if all(type(s) is QuantizedLinear for s in siblings):
        joined = quantized_linear.side_by_side(list(siblings))
        if joined is not None:
            return [_projection(joined)]
    return [_projection(s) for s in siblings]


def _projection(layer: torch.nn.Module):
    bias = _NO_BIAS if layer.bias is None else layer.bias.detach()
    native = cpu_kernels.native()
    if isinstance(layer, GGUFLinear):
        return native.Projection(layer.raw, _NO_BIAS, _NO_BIAS, bias, 0, False, layer.ggml_type)
    if isinstance(layer, QuantizedLinear):
        return native.Projection(layer.qweight, layer.scales, layer.mins, bias, layer.bits, layer.int8_activations)
    return native.Projection(layer.weight.detach(), _NO_BIAS, _NO_BIAS, bias, 0, False)
