"""The llm model's settings, each declared once here: its default, its check and its help.

They are read from `parameters` in `model_repository/llm/config.pbtxt` (`from_parameters`), overridden by the
flags of `tritonllm serve` (which builds its flags from these fields and hands them over in `OVERRIDES_ENV`),
or set in code. A test holds config.pbtxt's values equal to the defaults here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

OVERRIDES_ENV = "TRITONLLM_ENGINE_SETTINGS"  # JSON {setting: value}, from `serve`'s flags
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
KV_DTYPE_BYTES = DTYPE_BYTES | {
    "int8": 1
}  # an int8 cache adds a float32 scale per head vector (KVCache)  # torch is imported by the engine, not by the CLI
AUTO_KV_SHARE = 0.1  # of the memory available at load, for a KV cache sized by neither setting
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}


def setting(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class EngineConfig:
    model_dir: str
    dtype: str = setting(
        "auto", "weights, activations and KV cache: auto (float32 on CPU, bfloat16 on GPUs), float32, float16, bfloat16"
    )
    kv_cache_dtype: str = setting(
        "auto",
        "the KV cache's values: auto (dtype's), float32, bfloat16 (half the memory a token, so twice the context) or "
        "int8 (a scale per head vector: 3.8x the context of float32); keys and values rounded so, the arithmetic "
        "float32's: greedy output may differ from transformers'",
    )
    device: str = setting("auto", "auto (CUDA when present, else CPU), cpu, cuda or cuda:N")
    num_kv_blocks: int = setting(
        0,
        "KV cache size in blocks, unless kv_cache_memory is set (0: enough for max_num_seqs sequences of the "
        "model's whole context, within a tenth of the memory available at load)",
    )
    kv_cache_memory: str = setting(
        "", "KV cache size as memory: bytes (e.g. 512MiB, 2GB) or a fraction of the memory free at load (e.g. 0.2)"
    )
    block_size: int = setting(16, "tokens per KV block")
    max_num_seqs: int = setting(64, "sequences in one step at most")
    max_num_batched_tokens: int = setting(
        2048, "tokens in one step at most (longer prompts are chunked; a burst's prompts go in together up to it)"
    )
    enable_prefix_caching: bool = setting(True, "share the KV blocks of common prompt prefixes")
    prefill_slowdown: float = setting(
        2.0,
        "while streams decode, a step that also takes in prompts that arrived over a second after they began lasts "
        "at most this times a decode-only step (0: no cap beyond max_num_batched_tokens)",
    )
    quantized_weights: bool = setting(
        True,
        "a model served from a .gguf file keeps its weights in the file's blocks; false: dequantized to float32 "
        "(the file converted once into an HF folder)",
    )
    int8_activations: bool = setting(
        False,
        "quantized weights multiply the input rounded to 8 bits per 32 values, with integer dot products as "
        "llama.cpp does: faster, not exact (greedy output may differ from transformers')",
    )
    greedy_screen: bool = setting(
        True,
        "a greedy step that needs only the argmax multiplies by a smaller copy of a float32 output layer and "
        "computes in float32 only the tokens that can still be the argmax: the same tokens from a quarter of the "
        "layer's bytes (a copy in 8-bit blocks, steps of up to 8 sequences) or, where the CPU multiplies bfloat16 "
        "pairs, from a bfloat16 copy past 4 sequences (up to 64; the copies: 32 MB on SmolLM2, 89 MB with both)",
    )
    tensor_parallel_size: int = setting(
        1, "processes that split each layer's heads and MLP between them (torch.distributed: gloo on CPU, NCCL on GPUs)"
    )
    lora_cache_size: int = setting(8, "LoRA adapters kept by task id, least recently used out first (0: no LoRA)")
    max_queue_size: int = setting(256, "requests waiting beyond this are refused at once as overloaded (0: no limit)")
    max_queue_wait: float = setting(
        0.0,
        "seconds a request may expect to wait for admission: one with more requests of its priority or higher ahead "
        "of it than requests have been finishing in that time is refused at once as overloaded (0: no limit)",
    )
    stream_interval: int = setting(1, "a streaming request gets a response every N new tokens")
    speculative: str = setting(
        "none",
        "drafts verified in each decode step: none; ngram (the tokens that followed the latest earlier "
        "occurrence of the sequence's last n tokens, in its prompt or output); or draft_model (a smaller model "
        "with the same tokenizer, speculative_model, proposes them). Greedy output stays the same",
    )
    speculative_model: str = setting("", "the draft model's folder, for speculative=draft_model")
    num_speculative_tokens: int = setting(4, "draft tokens a sequence's decode step verifies at most (speculative)")
    prompt_lookup_min: int = setting(2, "shortest n-gram the ngram drafter matches")
    prompt_lookup_max: int = setting(4, "longest n-gram the ngram drafter matches (tried first)")
    engine_nice: int = setting(
        -10, "nice value of the engine thread and its workers (below 0 needs CAP_SYS_NICE; without it, ignored)"
    )
    gguf_file: str | None = None  # the .gguf file model_dir was dequantized from (formats/gguf.py)

    def __post_init__(self) -> None:
        checks = {
            "dtype": self.dtype == "auto" or self.dtype in DTYPE_BYTES,
            "kv_cache_dtype": self.kv_cache_dtype in ("auto", "float32", "bfloat16", "int8"),
            "device": re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None,
            "num_kv_blocks": self.num_kv_blocks >= 0,
            "block_size": self.block_size >= 1,
            "max_num_seqs": self.max_num_seqs >= 1,
            "max_num_batched_tokens": self.max_num_batched_tokens >= 1,
            "prefill_slowdown": self.prefill_slowdown == 0 or self.prefill_slowdown >= 1,
            "tensor_parallel_size": self.tensor_parallel_size >= 1,
            "lora_cache_size": self.lora_cache_size >= 0,
            "max_queue_size": self.max_queue_size >= 0,
            "max_queue_wait": self.max_queue_wait >= 0,
            "stream_interval": self.stream_interval >= 1,
            "speculative": self.speculative in ("none", "ngram", "draft_model"),
            "speculative_model": bool(self.speculative_model) == (self.speculative == "draft_model"),
            "num_speculative_tokens": self.num_speculative_tokens >= 1,
            "prompt_lookup_min": self.prompt_lookup_min >= 1,
            "prompt_lookup_max": self.prompt_lookup_max >= self.prompt_lookup_min,
            "engine_nice": -20 <= self.engine_nice <= 19,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not allowed ({_help(name)})")
        if self.kv_cache_memory:
            _memory(self.kv_cache_memory)

    @classmethod
    def settings(cls) -> list:
        """The fields a user sets (those with help), in declaration order."""
        return [f for f in fields(cls) if "help" in f.metadata]

    @classmethod
    def from_parameters(cls, model_dir: str, values: Mapping[str, str], **extra) -> EngineConfig:
        """From text values by setting name (config.pbtxt's parameters; unknown names are someone else's)."""
        given = {f: str(values.get(f.name, "")) for f in cls.settings()}
        return cls(model_dir, **{f.name: _parse(f, text) for f, text in given.items() if text.strip()}, **extra)

    @property
    def enable_lora(self) -> bool:
        return self.lora_cache_size > 0

    def kv_blocks(self, bytes_per_block: int, context_tokens: int) -> int:
        """num_kv_blocks, or as many blocks as kv_cache_memory holds; with neither, what max_num_seqs sequences
        of `context_tokens` each need, within AUTO_KV_SHARE of the memory available."""
        if not self.kv_cache_memory:
            if self.num_kv_blocks:
                return self.num_kv_blocks
            needed = -(-self.max_num_seqs * context_tokens // self.block_size)
            return max(1, min(needed, int(AUTO_KV_SHARE * available_memory(self.device) // bytes_per_block)))
        size = _memory(self.kv_cache_memory)
        if size <= 1:
            size *= available_memory(self.device)
        blocks = int(size // bytes_per_block)
        if blocks < 1:
            raise ValueError(f"kv_cache_memory: {self.kv_cache_memory} holds no KV block of {bytes_per_block} bytes")
        return blocks


def environment_overrides() -> dict[str, str]:
    """The settings `serve` was given as flags, which win over config.pbtxt's parameters."""
    return json.loads(os.environ.get(OVERRIDES_ENV) or "{}")


def _help(name: str) -> str:
    return next(f.metadata["help"] for f in EngineConfig.settings() if f.name == name)


def kind_of(setting) -> type:
    """A setting's Python type (its annotation is a string here: `from __future__ import annotations`)."""
    return {"int": int, "float": float, "bool": bool, "str": str}[str(setting.type)]


def _parse(f, text: str):
    kind = kind_of(f)
    try:
        if kind is bool:
            return {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False}[
                text.strip().lower()
            ]
        return kind(text.strip())
    except (KeyError, ValueError):
        raise ValueError(f"{f.name}: {text!r} is not a {kind.__name__} ({f.metadata['help']})") from None


def _memory(text: str) -> float:
    """Bytes, from '512MiB', '2GB', '1000000'; or a fraction in (0, 1] as itself."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]i?)?b?\s*", text.lower())
    if match is None:
        raise ValueError(f"kv_cache_memory: {text!r} is neither a size (e.g. 512MiB) nor a fraction (e.g. 0.2)")
    number, unit = float(match.group(1)), match.group(2) or ""
    if unit == "" and number <= 1:
        if number <= 0:
            raise ValueError("kv_cache_memory: a fraction must be above 0")
        return number
    return number * _UNITS[unit]


def available_memory(device: str) -> float:
    import torch

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return float(torch.cuda.mem_get_info(torch.device(device if device != "auto" else "cuda"))[0])
    with open("/proc/meminfo") as meminfo:
        kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
    return min(kib * 1024.0, _cgroup_headroom())


def _cgroup_headroom() -> float:
    """What the memory limit of this process's cgroup (a container's, a pod's) leaves; infinite without one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return float("inf")
    return float("inf") if limit == "max" else max(0.0, float(int(limit) - used))
