"""Freed heap handed back to the system after a load that allocated much and kept little.

glibc keeps freed memory for reuse, so a process's resident size stays at its load-time peak: the llm loading a
GGUF model frees the dequantized layers its blocks replace (77 MB on SmolLM2's Q4_1), and a tokenizer parsed from
its JSON frees the parse (27 MB on SmolLM2's, in each of preprocessing, postprocessing and the shim).
"""

from __future__ import annotations

import ctypes


def return_freed_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to ask
        pass
