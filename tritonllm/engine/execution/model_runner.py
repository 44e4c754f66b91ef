"""Loads an HF causal LM onto the paged attention and runs one packed forward pass per engine step."""

from __future__ import annotations

import dataclasses
import gc
import logging
from pathlib import Path

import torch

from tritonllm.common.memory import release_free_memory
from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.decoding import greedy_screen
from tritonllm.engine.execution import load_verdict, model_check, native_decode, reference_logits, step_packing
from tritonllm.engine.execution.device import resolve_device, resolve_dtype
from tritonllm.engine.execution.step_packing import Step
from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers import fused_projections, lora, native_linear, paged_attention, quantized_linear
from tritonllm.engine.layers.gguf_linear import GGUFLinear
from tritonllm.engine.layers.paged_attention import (
    ATTN_IMPLEMENTATION,
    KVCache,
    LayerProbe,
    PagedBatch,
)
from tritonllm.engine.models import gguf_model, gguf_swap, llama_model, weight_memory
from tritonllm.engine.models.model_shape import ModelShape
from tritonllm.engine.parallel import tensor_parallel
from tritonllm.engine.scheduling.block_manager import BlockManager
from tritonllm.engine.scheduling.scheduler import ScheduledChunk
from tritonllm.formats import gguf

log = logging.getLogger(__name__)


def _transformers_model(model_dir: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """The model as transformers builds it, its attention swapped for the paged one; a folder of a GGUF file's
    config alone gets the file's layers (gguf_model.py)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_check.check_config(AutoConfig.from_pretrained(model_dir))
    paged_attention.register()
    from_file = llama_model.serves_from_gguf(Path(model_dir))
    try:
        if from_file is not None:
            return gguf_model.build(Path(model_dir), from_file, ATTN_IMPLEMENTATION)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    except (ValueError, KeyError) as e:  # an architecture whose attention cannot be swapped for another
        if ATTN_IMPLEMENTATION not in str(e) and "attention" not in str(e):
            raise
        raise UnsupportedModelError(
            f"its attention does not go through transformers' AttentionInterface, so the paged attention "
            f"cannot replace it ({type(e).__name__}: {e})"
        ) from e
    return model.eval()


class ModelRunner:
    def __init__(
        self,
        model_dir: str | Path,
        blocks: BlockManager,
        dtype: str = "float32",
        device: str = "auto",
        enable_lora: bool = False,
        gguf_file: Path | None = None,
        tensor_parallel_size: int = 1,
        place: tensor_parallel.Place | None = None,
        int8_activations: bool = False,
        kv_cache_dtype: str | None = None,
        greedy_screen: bool = False,
    ):
        """`place`: this process's rank, for ranks 1.. of a tensor-parallel engine (tensor_parallel.py); rank 0,
        the engine's own process, gives `tensor_parallel_size` and starts the others. `int8_activations`: the
        GGUF blocks multiply 8-bit inputs (quantized_linear.py). `kv_cache_dtype`: the KV cache's (None: dtype's).
        `greedy_screen`: the native stack's greedy steps screen the output layer (greedy_screen.py)."""
        self.screens_greedy_steps = greedy_screen
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.kv_dtype_name = kv_cache_dtype or dtype
        self.kv_dtype = torch.int8 if self.kv_dtype_name == "int8" else resolve_dtype(self.kv_dtype_name)
        self.blocks = blocks
        # the native kernels (quantized matmuls, decode attention) take float32 on CPU
        cpu_float32 = self.device.type == "cpu" and self.dtype == torch.float32
        self.native_decode = cpu_float32 and cpu_kernels.native() is not None
        world = place.world if place is not None else tensor_parallel_size
        config = llama_model.ModelConfig.read(Path(model_dir))
        without_transformers = llama_model.why_not(config, Path(model_dir))
        if not self.native_decode or world > 1:
            without_transformers = "tensor parallel, and devices other than the CPU in float32, need it"
        from_file = llama_model.serves_from_gguf(Path(model_dir))
        if from_file is not None:
            # the weights are the file's blocks, read by the engine's Llama-family build or, for the architectures
            # it does not take, by transformers' modules with the file's layers in them (gguf_model.py)
            llama_family = gguf.architecture(from_file) in gguf.LLAMA_FAMILY
            if not self.native_decode or world > 1 or (llama_family and without_transformers is not None):
                why = without_transformers if llama_family else "its blocks are read on CPU in float32, one process"
                raise UnsupportedModelError(f"{from_file.name} is served from its blocks, which cannot be here: {why}")
            self._load(model_dir, config if llama_family else None, from_file, int8_activations, enable_lora)
            return
        if without_transformers is None:
            try:
                self._load(model_dir, config, gguf_file, int8_activations, enable_lora)
                return
            except (UnsupportedModelError, KeyError, RuntimeError) as e:
                log.warning("the model built without transformers failed its load: %s: %s", type(e).__name__, e)
                without_transformers = "the load check"
        log.info("the model runs through transformers' modules: %s", without_transformers)
        self._load(model_dir, None, gguf_file, int8_activations, enable_lora, world, place, dtype)

    def _load(
        self,
        model_dir: str | Path,
        config: llama_model.ModelConfig | None,
        gguf_file: Path | None,
        int8_activations: bool,
        enable_lora: bool = False,
        world: int = 1,
        place: tensor_parallel.Place | None = None,
        dtype: str = "float32",
    ) -> None:
        """Builds the model: with `config`, without transformers (llama_model.py), else through it."""
        self.transformers = config is None
        reference = None  # not kept: transformers' logits on the probe are 8 MB on SmolLM2
        if config is None:
            own = llama_model.ModelConfig.read(Path(model_dir))
            if own.mrope_section:
                why = llama_model.why_not(own, Path(model_dir))
                raise UnsupportedModelError(
                    f"{model_dir}: M-RoPE is served on the engine's Llama-family build, not {why}"
                )
            self.model = _transformers_model(model_dir, self.dtype).to(self.device)
            config = self.model.config
        self.shape = ModelShape.of(config)
        # M-RoPE's frequency sections (a multimodal Qwen2-VL's language model), else None
        self.mrope_section = None if self.transformers else config.mrope_section
        if not self.transformers:
            model_check.check_config(config)
            reference = reference_logits.reference(Path(model_dir), model_check.probe_ids(self), gguf_file)
            rotary = llama_model.RotaryEmbedding(reference.inv_freq, reference.attention_scaling, self.mrope_section)
            self.model = llama_model.LlamaModel.load(Path(model_dir), config, rotary)
        # the model's layers read a GGUF file's blocks in place (llama_model.py, gguf_linear.py)
        self.model_reads_file = llama_model.serves_from_gguf(Path(model_dir)) is not None
        self.quantized_layers = 0
        self.lora = None
        self.decoder_stack: native_decode.NativeDecode | None = None
        self.group: tensor_parallel.Group | None = None
        if world > 1:
            tensor_parallel.check(self.model, world)
            if gguf_file is not None or enable_lora:
                log.info("tensor_parallel_size=%d: the weights run dequantized, and LoRA is off", world)
        else:
            if self.model_reads_file:
                self.quantized_layers = sum(isinstance(m, GGUFLinear) for m in self.model.modules())
                if int8_activations:
                    recut = gguf_swap.recut_for_int8_activations(self.model)
                    log.info("int8_activations: %d of %d layers take 8-bit inputs", recut, self.quantized_layers)
            elif gguf_file is not None and self.native_decode:
                layout = reference.gguf_layout if reference else None
                self.quantized_layers = gguf_swap.quantize_from_gguf(self.model, gguf_file, int8_activations, layout)
            fast_linears = native_linear.available(self.device, self.dtype)
            fused_projections.fuse(self.model, fast_linears)
            if fast_linears:
                native_linear.install(self.model)
            self.lora = lora.install(self.model) if enable_lora else None
        copied = weight_memory.copy_out_of_files(self.model)
        log.info("weights: %.0f MiB copied out of the checkpoint's mapping", copied / 2**20)
        self.int8_activations = int8_activations and any(
            isinstance(m, quantized_linear.QuantizedLinear) and m.int8_activations for m in self.model.modules()
        )
        if int8_activations and not self.int8_activations:
            log.info("int8_activations: no layer keeps GGUF blocks here, so every input stays float32")
        if place is None:  # the engine's process checks the model whole, before any split
            self.cache = self._allocate_cache()
            with quantized_linear.float_inputs(self.model):
                if world == 1 and self.native_decode:
                    self._use_decoder_stack()
                self._check(model_dir, gguf_file, reference.logits if reference else None)
            if self.int8_activations and self.decoder_stack is not None:
                self._use_decoder_stack()  # checked, now built again with the 8-bit inputs it serves with
        if world > 1:
            self._split(place or tensor_parallel.Place(0, world, 0), model_dir, dtype)
        gc.collect()  # the load's cycles hold the checkpoint's and the GGUF file's mappings (some 90 MB resident)
        release_free_memory()

    def _check(self, model_dir: str | Path, gguf_file: Path | None, reference: torch.Tensor | None) -> None:
        """The load check; for a model read in place from a GGUF file, its verdict kept between starts
        (load_verdict.py)."""
        kept = None
        if self.model_reads_file:
            settings = [self.dtype, self.kv_dtype_name, self.int8_activations, self.decoder_stack is not None]
            kept = load_verdict.verdict_file(Path(model_dir), gguf_file, settings)
        verdict = load_verdict.read(kept)
        if verdict is not None:
            if not verdict["native_stack"]:
                self.decoder_stack = None
            log.info("the load check's verdict on %s is kept from an earlier start (%s)", gguf_file.name, kept.name)
            return
        model_check.check_against_eager(self, reference)
        load_verdict.keep(kept, self.decoder_stack is not None)

    def _use_decoder_stack(self) -> None:
        reason = native_decode.why_not(self.model)
        if reason is not None:
            log.info("decode steps run through transformers' modules: %s", reason)
            return
        self.decoder_stack = native_decode.NativeDecode(self.model, self.cache, self.screens_greedy_steps)

    def _kv_layout(self) -> step_packing.KVLayout:
        return step_packing.KVLayout(
            self.blocks, self.device, self.shape.num_kv_heads, self.shape.head_dim, self.kv_dtype
        )

    def _allocate_cache(self) -> KVCache:
        return KVCache.allocate(
            self.shape.num_layers,
            self.blocks.num_blocks,
            self.blocks.block_size,
            self.shape.num_kv_heads,
            self.shape.head_dim,
            self.kv_dtype,
            self.device,
        )

    def _split(self, place: tensor_parallel.Place, model_dir: str | Path, dtype: str) -> None:
        """Keeps this rank's share of the layers and of the KV cache; rank 0 starts the other ranks."""
        tensor_parallel.shard(self.model, place)
        if native_linear.available(self.device, self.dtype):
            native_linear.install(self.model)
        self.shape = dataclasses.replace(self.shape, num_kv_heads=self.shape.num_kv_heads // place.world)
        self.cache = None  # the whole cache goes before this rank's share is allocated
        self.cache = self._allocate_cache()
        if place.rank:
            self.group = tensor_parallel.Group(place, self.device)
            return
        worker_args = [
            f"--model-dir={model_dir}",
            f"--dtype={dtype}",
            f"--kv-cache-dtype={self.kv_dtype_name}",
            f"--device={self.device.type}",
            f"--num-blocks={self.blocks.num_blocks}",
            f"--block-size={self.blocks.block_size}",
        ]
        self.group = tensor_parallel.Group.start(place.world, self.device, worker_args)

    def follow(self) -> None:
        """Ranks 1..: runs the steps rank 0 sends until it ends the group."""
        while (step := self.group.receive(self.device)) is not None:
            self.run(step)
        self.group.close()

    def close(self) -> None:
        if self.group is not None and self.group.place.rank == 0:
            self.group.close()
            self.group = None

    @torch.inference_mode()
    def forward(
        self, chunks: list[ScheduledChunk], probe: LayerProbe | None = None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Runs the chunks as one packed batch (`probe`: see model_check).

        Returns float32 logits for the chunks that sample, in order: one row each, plus one per draft token it
        carries; and, for sequences that want their prompt's logits, those of this chunk's prompt positions not
        recorded yet, by chunk index.
        """
        rows = step_packing.rows_of(chunks, self.blocks)
        input_ids, positions, slots = rows.input_ids, rows.positions, rows.slots
        sample_rows, context_rows = rows.sample_rows, rows.context_rows
        dev = self.device
        keep = sample_rows + [r for rows in context_rows.values() for r in rows]
        native = self._native_serves(chunks, probe)
        step = Step(
            inputs=self._inputs(chunks, input_ids),
            # [1, T]; M-RoPE's [3, 1, T] where a sequence has them
            position_ids=torch.tensor(
                [positions] if rows.rope_rows is None else [[r] for r in rows.rope_rows], device=dev
            ),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            groups=[] if native else step_packing.attention_groups(chunks, self._kv_layout(), self.native_decode),
            logits_to_keep=torch.tensor(keep or [0], device=dev),
            copies=self.blocks.pending_copies,
            native_rows=step_packing.native_rows(chunks, self.blocks, self.device) if native else None,
            screened=native and self._screens(chunks, sample_rows, context_rows),
        )
        self.blocks.pending_copies = []
        self._assign_adapters(chunks)
        if self.group is not None:
            self.group.send(step)
        logits = self.run(step, probe)
        context, at = {}, len(sample_rows)
        for index, rows in context_rows.items():
            context[index] = logits[at : at + len(rows)]
            at += len(rows)
        return logits[: len(sample_rows)], context

    @torch.inference_mode()
    def run(self, step: Step, probe: LayerProbe | None = None) -> torch.Tensor:
        """The step's forward pass: float32 logits of the rows it keeps."""
        if step.copies:
            self.cache.copy_blocks(step.copies)
        if step.native_rows is not None:
            return self.decoder_stack.logits(
                step.inputs, step.position_ids, step.slot_mapping, *step.native_rows, step.logits_to_keep, step.screened
            )
        batch = PagedBatch(cache=self.cache, slot_mapping=step.slot_mapping, groups=step.groups, probe=probe)
        out = self.model(
            **step.inputs,
            position_ids=step.position_ids,
            use_cache=False,
            logits_to_keep=step.logits_to_keep,
            paged_batch=batch,
        )
        return out.logits[0].float()

    def _native_serves(self, chunks: list[ScheduledChunk], probe: LayerProbe | None) -> bool:
        """Whether the native decoder stack runs these chunks: the model's own weights, no adapter."""
        if self.decoder_stack is None or probe is not None:  # one rank only: tensor parallel builds no stack
            return False
        return all(c.seq.adapter is None for c in chunks)

    def _screens(self, chunks: list[ScheduledChunk], sample_rows: list[int], context_rows: dict) -> bool:
        return (
            self.decoder_stack.screen is not None
            and not context_rows
            and 0 < len(sample_rows) <= greedy_screen.max_rows()
            and all(greedy_screen.screenable(c.seq) for c in chunks if c.samples)
        )

    def _assign_adapters(self, chunks: list[ScheduledChunk]) -> None:
        if self.lora is None:
            return
        rows: dict[int, tuple] = {}
        offset = 0
        for chunk in chunks:
            adapter = chunk.seq.adapter
            if adapter is not None:
                rows.setdefault(id(adapter), (adapter, []))[1].extend(range(offset, offset + chunk.num_fed))
            offset += chunk.num_fed
        self.lora.groups = [(a, torch.tensor(r, dtype=torch.long, device=self.device)) for a, r in rows.values()]

    def _inputs(self, chunks: list[ScheduledChunk], input_ids: list[int]) -> dict[str, torch.Tensor]:
        """`input_ids`, or `inputs_embeds` where p-tuning ids (>= vocab size) pick rows of a prompt table."""
        ids = torch.tensor([input_ids], device=self.device)
        vocab = self.shape.vocab_size
        if not any(c.seq.prompt_table is not None for c in chunks):
            return {"input_ids": ids}
        embeds = self.model.get_input_embeddings()(ids.clamp(max=vocab - 1))
        offset = 0
        for chunk in chunks:
            table = chunk.seq.prompt_table
            if table is not None:
                fed = ids[0, offset : offset + chunk.num_fed]
                virtual = (fed >= vocab).nonzero().flatten()
                embeds[0, offset + virtual] = table[fed[virtual] - vocab].to(embeds.dtype)
            offset += chunk.num_fed
        return {"inputs_embeds": embeds}
