"""The load check's verdict on a model read in place from a GGUF file, kept between starts.

The check (model_check.check_against_eager) runs a probe prompt through the engine's modules and its native stack
(and against transformers' logits where the file is small enough for them): on an 8B file it is nine tenths of the
load. Its outcome depends only on the file, the folder's config, this engine's code, the kernel build, the dtypes and
the library versions; a start with all of them unchanged reads the verdict instead of probing again, as gguf_swap.py
keeps its own checks. Any change makes a new key, so the probe runs again.
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

from tritonllm.engine.kernels import cpu_kernels
from tritonllm.formats import model_cache

ENGINE = Path(__file__).resolve().parents[1]  # the whole engine package: any change to its code is a new verdict


def verdict_file(model_dir: Path, gguf_file: Path, settings: list) -> Path | None:
    """Where the verdict for this file, folder, code, kernel build and `settings` lives; None without the native
    kernels (nothing is kept)."""
    module = cpu_kernels.native()
    if module is None:
        return None
    kernels = Path(module.__file__)
    code = [hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(ENGINE.rglob("*.py"))]
    code += [hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(cpu_kernels.native_sources())]
    identity = [
        str(gguf_file.resolve()),
        gguf_file.stat().st_size,
        gguf_file.stat().st_mtime_ns,
        (Path(model_dir) / "config.json").read_text(),
        code,
        str(kernels),
        kernels.stat().st_mtime_ns,
        [str(s) for s in settings],
        *(version(package) for package in ("torch", "transformers", "gguf")),
    ]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
    return model_cache.cache_dir() / f"{key}.load_check.json"


def read(path: Path | None) -> dict | None:
    """The kept verdict ({"native_stack": bool}), or None where the probe must run."""
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def keep(path: Path | None, native_stack: bool) -> None:
    if path is not None:
        model_cache.write(path, json.dumps({"native_stack": native_stack}))
