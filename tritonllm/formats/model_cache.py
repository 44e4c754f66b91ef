"""Files derived from a model's tokenizer, kept between starts so that a start need not import transformers
(4.5 s of CPU and 340 MB in each process that does): keyed by the model directory, the sizes and times of its
files other than weights, and the versions of transformers and tokenizers."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Collection
from importlib.metadata import version
from pathlib import Path

CACHE_ENV = "TRITONLLM_TOKENIZER_CACHE"
WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt")


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tritonllm" / "tokenizers"
    return Path(os.environ.get(CACHE_ENV) or default)


def cache_key(model_dir: Path, derived_by: Path | None = None) -> str:
    """`derived_by`: the source file that computes the cached value, so that a change to it is a new key."""
    model_dir = Path(model_dir).resolve()
    files = sorted(
        (path.name, path.stat().st_size, path.stat().st_mtime_ns)
        for path in model_dir.iterdir()
        if path.is_file() and not path.name.endswith(WEIGHTS)
    )
    code = hashlib.sha256(derived_by.read_bytes()).hexdigest() if derived_by else ""
    identity = [str(model_dir), files, version("transformers"), version("tokenizers"), code]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]


def cached_file(model_dir: Path, kind: str, derived_by: Path | None = None) -> Path:
    """Where the model's file of this kind lives (it may not exist yet)."""
    return cache_dir() / f"{cache_key(model_dir, derived_by)}.{kind}"


def write(path: Path, text: str) -> None:
    """Written beside and renamed, so a reader never sees half a file; a cache that cannot be written is none."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()


def detected_name(model_dir: Path, kind: str, derived_by: Path, known: Collection[str], detect: Callable) -> str:
    """A name detected from the model's tokenizer (`detect(tokenizer)`), once: later calls read it from the cache,
    so that `serve` need not load the tokenizer through transformers on every start."""
    cached = cached_file(model_dir, kind, derived_by=derived_by)
    name = cached.read_text().strip() if cached.is_file() else ""
    if name in known:
        return name
    from tritonllm.formats.hf_folder import load_tokenizer

    name = detect(load_tokenizer(model_dir))
    write(cached, name)
    return name
