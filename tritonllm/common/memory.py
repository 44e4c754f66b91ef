"""Free memory handed back to the system after a load, whichever allocator the process runs on."""

from __future__ import annotations

import ctypes


def release_free_memory() -> None:
    """Hands the allocator's free pages back to the system after a load that allocated much and kept little, so a
    process's resident size does not stay at its load-time peak: the llm's transient buffers (weights converted,
    the native stack's copies; ~350 MB on SmolLM2 that tcmalloc would keep, 77 MB of dequantized layers on its Q4_1
    file that glibc would), a tokenizer's JSON parse (27 MB on SmolLM2's, in each process that parses one). The
    one call for every process, whichever allocator it runs on: each tensor-parallel rank's load goes through it too."""
    process = ctypes.CDLL(None)
    if release := getattr(process, "MallocExtension_ReleaseFreeMemory", None):  # tcmalloc's
        release()
    elif trim := getattr(process, "malloc_trim", None):  # glibc's (musl has none)
        trim(0)
