"""The engine's one native kernel: decode attention read in place from the paged cache (see kernels/).

Built with the machine's C++ compiler on first use and cached under `.cache/torch_extensions` (or
$TORCH_EXTENSIONS_DIR). Where it cannot be built, `decode_attention()` is None and the engine uses the
pure-PyTorch path, which gives the same results more slowly.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "kernels" / "paged_decode_attention.cpp"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "torch_extensions"
DISABLE_ENV = "TRITONLLM_NO_NATIVE_KERNELS"


def _build():
    if os.environ.get(DISABLE_ENV):
        return None
    try:
        from torch.utils.cpp_extension import load

        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(CACHE))
        module = load(
            name="tritonllm_paged_decode_attention",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
        return module.paged_decode_attention
    except Exception as e:  # no compiler, headers or ninja: the PyTorch path still works
        log.warning("native decode attention unavailable (%s); using the PyTorch path", e)
        return None


decode_attention = _build()
