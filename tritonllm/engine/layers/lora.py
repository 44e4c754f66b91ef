"""LoRA adapters per request, inside the shared batch, in TensorRT-LLM's tensor format.

`lora_config` rows are `[module_id, layer_idx, adapter_size r]`; the matching `lora_weights` row holds the
module's A (r x in_features) then B (out_features x r), flattened, zero-padded to the longest row. The delta
B @ A @ x is added as given (fold any alpha / r scaling into B). Module ids follow TensorRT-LLM's numbering:

| id | module (Llama-style names) |
|---|---|
| 1 | attn_q: self_attn.q_proj |
| 2 | attn_k: self_attn.k_proj |
| 3 | attn_v: self_attn.v_proj |
| 4 | attn_dense: self_attn.o_proj |
| 5 | mlp_h_to_4h: mlp.up_proj |
| 6 | mlp_4h_to_h: mlp.down_proj |
| 7 | mlp_gate: mlp.gate_proj |

(0, the fused attn_qkv, has no counterpart in models with separate q/k/v projections and is refused.)
Adapters are cached by task id, least recently used out first; a request may then send the task id alone.
With several llm instances, each caches on its own, and the weights a request brought are also written to a
folder the instances share, from which another instance unpacks them when a later request names the task id.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tritonllm.common.errors import RequestError
from tritonllm.formats.lora_adapters import MODULES

# why a request naming an adapter is refused when install() wrapped nothing or was not asked to
UNAVAILABLE = (
    "LoRA is not available on this model: lora_cache_size is 0, tensor_parallel_size is above 1, "
    "or no layer has the modules LoRA names"
)


@dataclass(eq=False)
class Adapter:
    task_id: int
    # (layer, module name) -> (A [r, in], B [out, r])
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


class AdapterCache:
    def __init__(self, capacity: int, shared: Path | None = None) -> None:
        """`shared`: a folder the model's instances share, holding the latest `capacity` adapters' tensors."""
        self.capacity = capacity
        self.shared = shared
        self._adapters: OrderedDict[int, Adapter] = OrderedDict()
        self._written: set[Path] = set()

    def share(self, task_id: int, weights: np.ndarray, config: np.ndarray) -> None:
        if self.shared is None:
            return
        self.shared.mkdir(parents=True, exist_ok=True)
        path = self.shared / f"{task_id}.npz"
        partial = path.with_suffix(f".{os.getpid()}.partial")
        with open(partial, "wb") as f:
            np.savez(f, weights=weights, config=config)
        partial.replace(path)  # whole or not at all, for an instance reading it now
        self._written.add(path)
        for old in sorted(self.shared.glob("*.npz"), key=lambda p: p.stat().st_mtime)[: -self.capacity]:
            old.unlink(missing_ok=True)

    def shared_tensors(self, task_id: int) -> tuple[np.ndarray, np.ndarray] | None:
        path = None if self.shared is None else self.shared / f"{task_id}.npz"
        try:
            with np.load(path) as stored:
                return stored["weights"], stored["config"]
        except (OSError, TypeError, KeyError, ValueError):
            return None

    def close(self) -> None:
        """Removes the shared files this instance wrote."""
        for path in self._written:
            path.unlink(missing_ok=True)

    def get(self, task_id: int) -> Adapter | None:
        adapter = self._adapters.get(task_id)
        if adapter is not None:
            self._adapters.move_to_end(task_id)
        return adapter

    def put(self, task_id: int, adapter: Adapter) -> None:
        self._adapters[task_id] = adapter
        self._adapters.move_to_end(task_id)
        while len(self._adapters) > self.capacity:
            self._adapters.popitem(last=False)

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._adapters


def resolve(
    cache: AdapterCache, task_id: int, weights: np.ndarray | None, config: np.ndarray | None, model: torch.nn.Module
) -> Adapter:
    """The adapter a request names: unpacked and cached when it brings weights, else taken from the cache."""
    if (weights is None) != (config is None):
        raise RequestError("lora_weights", "lora_weights and lora_config come together")
    if weights is not None:
        adapter = parse_adapter(task_id, weights, config, model)
        cache.put(task_id, adapter)
        cache.share(task_id, weights, config)
        return adapter
    adapter = cache.get(task_id)
    if adapter is None and (stored := cache.shared_tensors(task_id)) is not None:
        adapter = parse_adapter(task_id, *stored, model)
        cache.put(task_id, adapter)
    if adapter is None:
        raise RequestError(
            "lora_task_id",
            f"lora_task_id {task_id} is not cached (or was evicted); send lora_weights and lora_config with it",
        )
    return adapter


def parse_adapter(task_id: int, weights: np.ndarray, config: np.ndarray, model: torch.nn.Module) -> Adapter:
    """Checks and unpacks TensorRT-LLM's lora_weights / lora_config against the model's layers."""
    config = config.reshape(-1, 3).astype(np.int64)
    rows = weights.reshape(len(config), -1) if weights.size else weights
    if weights.size == 0 or rows.shape[0] != len(config):
        raise RequestError(
            "lora_weights",
            f"lora_weights must have one row per lora_config row ({len(config)}), got {list(weights.shape)}",
        )
    layers = model.model.layers
    unpacked = {}
    for row, (module_id, layer, rank) in zip(rows, config.tolist(), strict=True):
        if module_id not in MODULES:
            raise RequestError("lora_config", f"lora_config: module id {module_id} is not one of {sorted(MODULES)}")
        if not 0 <= layer < len(layers):
            raise RequestError("lora_config", f"lora_config: layer {layer} is outside [0, {len(layers)})")
        linear = layers[layer].get_submodule(MODULES[module_id])
        linear = getattr(linear, "base", linear)  # the Linear inside an installed LoraLinear
        size = rank * (linear.in_features + linear.out_features)
        if rank < 1 or size > row.size:
            raise RequestError(
                "lora_config",
                f"lora_config: adapter size {rank} of module {module_id} does not fit its lora_weights row",
            )
        a = torch.from_numpy(row[: rank * linear.in_features].astype(np.float32)).view(rank, linear.in_features)
        b = torch.from_numpy(row[rank * linear.in_features : size].astype(np.float32)).view(linear.out_features, rank)
        unpacked[(layer, MODULES[module_id])] = (a.to(model.dtype), b.to(model.dtype))
    return Adapter(task_id, unpacked)


@dataclass
class LoraBatch:
    """Which packed-batch rows each adapter of this step applies to; set by the runner before each forward."""

    groups: list[tuple[Adapter, torch.Tensor]] = field(default_factory=list)


class LoraLinear(torch.nn.Module):
    """A model's Linear plus the deltas of the adapters that this step's rows use."""

    def __init__(self, base: torch.nn.Linear, key: tuple[int, str], batch: LoraBatch) -> None:
        super().__init__()
        self.base = base
        self.key = key
        self.batch = batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        for adapter, rows in self.batch.groups:
            pair = adapter.weights.get(self.key)
            if pair is not None:
                a, b = pair
                out[0, rows] += (x[0, rows] @ a.T) @ b.T
        return out


def install(model: torch.nn.Module) -> LoraBatch | None:
    """Wraps every module a LoRA id can name; returns the batch object the runner fills per step, or None when
    the model has none of them (an architecture that names its layers otherwise, such as GPT-2)."""
    batch, wrapped = LoraBatch(), 0
    for index, layer in enumerate(getattr(getattr(model, "model", None), "layers", [])):
        for name in MODULES.values():
            parent_name, _, child = name.rpartition(".")
            parent = getattr(layer, parent_name, None)
            if parent is not None and hasattr(parent, child):
                setattr(parent, child, LoraLinear(getattr(parent, child), (index, name), batch))
                wrapped += 1
    return batch if wrapped else None
