"""The memory allocator tritonserver and the models' stubs run with: tcmalloc, preloaded, where the machine has it
(Debian's and Ubuntu's `libtcmalloc-minimal4`, which `make install` and deploy/Dockerfile install), as vLLM's and
SGLang's CPU builds preload it.

Every streamed response allocates and frees its tensors and messages in tritonserver, and the llm's steps
allocate and free megabytes of activations and logits, which glibc hands back to the system and takes again page
fault by page fault; tcmalloc keeps them (bench/results/log.md, "tcmalloc under tritonserver and the stubs").
jemalloc slows the llm's prompt steps (more page faults there), so it is not the default.

`TRITONLLM_ALLOCATOR`: unset or `tcmalloc` for this, `system` for glibc's malloc, or the path of a library to
preload instead (jemalloc's, say). An LD_PRELOAD already in the environment is kept, the allocator put in front.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

SETTING = "TRITONLLM_ALLOCATOR"
TCMALLOC = "libtcmalloc_minimal.so.4"


def library_dirs() -> list[Path]:
    multiarch = sysconfig.get_config_var("MULTIARCH")
    return [
        Path(d) for d in (f"/usr/lib/{multiarch}" if multiarch else "", "/usr/lib64", "/usr/lib", "/usr/local/lib") if d
    ]


def chosen(environ: dict[str, str] | None = None) -> str:
    """The setting's value: `tcmalloc` (the default), `system` or a library's path."""
    return (environ if environ is not None else os.environ).get(SETTING, "tcmalloc")


def allocator_library(environ: dict[str, str] | None = None) -> Path | None:
    """The library to preload, or None (glibc's malloc: asked for, or tcmalloc not installed)."""
    choice = chosen(environ)
    if choice == "system":
        return None
    if choice != "tcmalloc":
        path = Path(choice)
        if not path.is_file():
            raise FileNotFoundError(f"{SETTING}={choice}: no such library (tcmalloc, system, or a library's path)")
        return path
    return next((d / TCMALLOC for d in library_dirs() if (d / TCMALLOC).is_file()), None)


def with_allocator(env: dict[str, str]) -> dict[str, str]:
    """`env` with the allocator in front of its LD_PRELOAD (unchanged where there is none to preload, or the
    library is already preloaded)."""
    library = allocator_library(env)
    preloaded = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    if library is None or str(library) in preloaded:
        return env
    preload = " ".join([str(library), *preloaded])
    # tcmalloc reports every allocation above 1 GB on stderr (a large model's weights): not news in a server
    return {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2**40), **env, "LD_PRELOAD": preload}
