"""Refuses, at load, a model that the paged attention cannot run exactly: never silently wrong output.

Two checks. The config names attention kinds this engine does not implement (chunked, bidirectional, linear or
state-space layers). Then a probe: a short prompt goes through the engine's own path, a prefill and a decode
step over the paged cache, and through transformers' eager attention on the same weights. Every layer must have
attended through the paged cache, with no argument it does not implement (gpt-oss's attention sinks, say), and
the two must give the same logits. Where the runner has a native decoder stack (native_decode.py), its prefill
and decode step must give them too, else the stack is dropped.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.layers.paged_attention import ATTN_IMPLEMENTATION, LayerProbe
from tritonllm.engine.models.model_shape import ModelShape
from tritonllm.engine.scheduling.block_manager import BlockManager
from tritonllm.engine.scheduling.scheduler import ScheduledChunk
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

log = logging.getLogger(__name__)

SUPPORTED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
PROBE_TOKENS = 40  # crosses the windows of the test models; real windows are covered by the engine's own tests
# Largest logit difference from eager attention, as a fraction of the largest logit: float32 differs only in
# summation order; half precision rounds every op.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 5e-2, torch.int8: 1e-1}  # int8: a KV cache


class ProbedRunner(Protocol):
    """What the probe reads of a model runner (model_runner.ModelRunner, which runs the probe during its load)."""

    blocks: BlockManager
    shape: ModelShape
    model: torch.nn.Module
    dtype: torch.dtype
    kv_dtype: torch.dtype
    decoder_stack: object | None  # dropped (set to None) where its logits are not the model's

    def forward(
        self, chunks: list[ScheduledChunk], probe: LayerProbe | None = None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]: ...


def check_config(config) -> None:
    problems = []
    unknown_layers = sorted(set(getattr(config, "layer_types", None) or []) - SUPPORTED_LAYER_TYPES)
    if unknown_layers:
        problems.append(f"layer types {unknown_layers} (only {sorted(SUPPORTED_LAYER_TYPES)} are implemented)")
    if getattr(config, "use_bidirectional_attention", False):
        problems.append("bidirectional attention (use_bidirectional_attention)")
    if getattr(config, "attention_chunk_size", None):
        problems.append("chunked attention (attention_chunk_size)")
    if getattr(config, "is_encoder_decoder", False):
        problems.append("an encoder-decoder architecture")
    if problems:
        raise UnsupportedModelError(f"{config.model_type} model with " + "; ".join(problems))


def probe_ids(runner: ProbedRunner) -> list[int]:
    """The probe prompt: as long as the cache and the model allow, up to PROBE_TOKENS."""
    blocks, shape = runner.blocks, runner.shape
    length = min(PROBE_TOKENS, blocks.num_blocks * blocks.block_size, shape.max_position_embeddings)
    return [(i * 7919 + 11) % shape.vocab_size for i in range(length)]


def check_against_eager(runner: ProbedRunner, reference: torch.Tensor | None = None) -> None:
    """Runs the probe; raises UnsupportedModelError where the paged path is not the model's own attention.
    `reference`: transformers' eager logits on probe_ids, computed elsewhere (for a model built without
    transformers, llama_model.py); else they are computed here on the runner's model."""
    shape = runner.shape
    ids = probe_ids(runner)
    length = len(ids)
    probe = LayerProbe()
    try:
        paged = _paged_logits(runner, ids, probe)
        eager = reference if reference is not None else _eager_logits(runner.model, ids)
        if eager is None:  # no transformers' reference to hold it to: the native stack is held to the modules
            eager = paged
    except Exception as e:
        raise UnsupportedModelError(f"the paged attention cannot run this model: {type(e).__name__}: {e}") from e
    missing = sorted(set(range(shape.num_layers)) - probe.layers)
    if missing:
        raise UnsupportedModelError(
            f"layers {missing} do not attend through the KV cache (linear-attention or state-space layers?)"
        )
    if probe.unsupported:
        named = ", ".join(f"{name} (layers {sorted(layers)})" for name, layers in sorted(probe.unsupported.items()))
        raise UnsupportedModelError(f"attention arguments the paged attention does not implement: {named}")
    difference = (paged - eager).abs().max().item()
    allowed = _allowed(runner, eager)
    if not difference <= allowed:
        raise UnsupportedModelError(
            f"the paged attention's logits differ from transformers' eager attention by {difference:.3g} "
            f"(allowed {allowed:.3g}) on a {length}-token probe"
        )
    if runner.decoder_stack is not None:
        native = _paged_logits(runner, ids, None)  # its prefill's logits and its decode step's
        gap = (native - eager).abs().max().item()
        if not gap <= allowed:
            log.warning("the native decoder stack's logits differ from transformers' by %.3g: not used", gap)
            runner.decoder_stack = None


def _allowed(runner: ProbedRunner, eager: torch.Tensor) -> float:
    # a cache of lower precision than the weights rounds every key and value it holds
    return max(TOLERANCE[runner.dtype], TOLERANCE[runner.kv_dtype]) * eager.abs().max().item()


def _paged_logits(runner: ProbedRunner, ids: list[int], probe: LayerProbe | None) -> torch.Tensor:
    """Logits of every position: a prefill of all tokens but the last, then a decode step of the last (without a
    probe, by the native decoder stack where the runner has one)."""
    seq = Sequence(ids[:-1], SamplingParams(max_tokens=1, return_context_logits=True))
    runner.blocks.grow(seq, len(ids))
    try:
        _, context = runner.forward([ScheduledChunk(seq, len(ids) - 1)], probe)
        seq.num_computed = len(ids) - 1
        seq.token_ids.append(ids[-1])
        decoded, _ = runner.forward([ScheduledChunk(seq, 1)], probe)
    finally:
        runner.blocks.free(seq)
    return torch.cat([context.get(0, decoded[:0]), decoded])


@torch.inference_mode()
def _eager_logits(model, ids: list[int]) -> torch.Tensor | None:
    """transformers' eager logits on the model's weights; None for a model built without transformers whose
    reference was not computed (a GGUF file too large for transformers' float32 copy: reference_logits.py)."""
    if not hasattr(model, "set_attn_implementation"):
        return None
    model.set_attn_implementation("eager")
    try:
        return model(input_ids=torch.tensor([ids], device=model.device), use_cache=False).logits[0].float()
    finally:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
