"""LoRA adapters as people have them, PEFT folders (`adapter_config.json` + `adapter_model.safetensors`), turned into
the llm's LoRA tensors (TensorRT-LLM's `lora_weights` / `lora_config`, tritonllm/engine/layers/lora.py), so that the
shim serves each adapter under a model name of its own, as vLLM's `--lora-modules` does.

Only what the engine computes exactly as PEFT does is taken: plain LoRA (delta = B @ A @ x times alpha / r, or
alpha / sqrt(r) with rsLoRA, alpha and r per module where `alpha_pattern` / `rank_pattern` say so) on the
attention and MLP projections. DoRA, LoRA biases, extra trainable modules or tokens and the other PEFT variants
are refused at load with the setting that names them. Torch-free: the shim loads them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# TensorRT-LLM's module ids, and the Llama-style module each names
MODULES = {
    1: "self_attn.q_proj",
    2: "self_attn.k_proj",
    3: "self_attn.v_proj",
    4: "self_attn.o_proj",
    5: "mlp.up_proj",
    6: "mlp.down_proj",
    7: "mlp.gate_proj",
}
_MODULE_IDS = {name: module_id for module_id, name in MODULES.items()}
_KEY = re.compile(
    r"(?:.*\.)?layers\.(\d+)\.(" + "|".join(re.escape(m) for m in MODULES.values()) + r")\.lora_([AB])\.weight$"
)
# PEFT settings that change what an adapter computes beyond plain LoRA: refused unless off
_UNSUPPORTED = {
    "use_dora": "DoRA",
    "lora_bias": "a LoRA bias",
    "modules_to_save": "fully trained modules beside the adapter",
    "trainable_token_indices": "trained token embeddings",
    "layer_replication": "replicated layers",
    "fan_in_fan_out": "transposed (Conv1D) weights",
    "use_qalora": "QALoRA",
    "alora_invocation_tokens": "activated LoRA",
}


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: Path
    task_id: int  # from the adapter's contents: the same adapter has the same id in every shim
    weights: np.ndarray  # [rows, width] float32: each row a module's A then its scaled B, flattened
    config: np.ndarray  # [rows, 3] int32: module id, layer, rank


def load_peft(name: str, path: Path) -> LoraAdapter:
    """The PEFT adapter folder `path`, served as `name`; ValueError naming what cannot be served."""
    settings_file, weights_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not settings_file.is_file() or not weights_file.is_file():
        raise ValueError(f"LoRA adapter {name}: {path} holds no adapter_config.json and adapter_model.safetensors")
    settings = json.loads(settings_file.read_text())
    if settings.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA adapter {name}: peft_type {settings['peft_type']} is not LORA")
    if settings.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {name}: bias {settings['bias']!r} is not served (only 'none')")
    for key, what in _UNSUPPORTED.items():
        if settings.get(key):
            raise ValueError(f"LoRA adapter {name}: {key} ({what}) is not served")
    from safetensors.numpy import load_file

    tensors = load_file(weights_file)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    full_names: dict[tuple[int, str], str] = {}  # as PEFT names the module, e.g. model.layers.0.self_attn.q_proj
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise ValueError(f"LoRA adapter {name}: {key} is not a projection this server applies LoRA to")
        layer, module, side = int(match.group(1)), match.group(2), match.group(3)
        pairs.setdefault((layer, module), {})[side] = tensor.astype(np.float32)
        full_names[layer, module] = key.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]
    rows, config = [], []
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name}: layer {layer} {module} has lora_{''.join(pair)} alone")
        a, b = pair["A"], pair["B"]
        rank = a.shape[0]
        alpha = _pattern(settings.get("alpha_pattern") or {}, full_names[layer, module], settings["lora_alpha"])
        scale = alpha / math.sqrt(rank) if settings.get("use_rslora") else alpha / rank
        rows.append(np.concatenate([a.ravel(), (b * np.float32(scale)).ravel()]))
        config.append([_MODULE_IDS[module], layer, rank])
    if not rows:
        raise ValueError(f"LoRA adapter {name}: {weights_file} holds no LoRA weights")
    width = max(len(row) for row in rows)
    weights = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        weights[i, : len(row)] = row
    config_array = np.array(config, dtype=np.int32)
    digest = hashlib.sha256(weights.tobytes() + config_array.tobytes()).digest()
    task_id = int.from_bytes(digest[:8], "little") >> 1  # within int64, which Triton's clients handle everywhere
    return LoraAdapter(name, path, task_id, weights, config_array)


def _pattern(patterns: dict[str, float], module: str, default: float) -> float:
    """PEFT's per-module override: the first pattern that matches the end of the module's name."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default
