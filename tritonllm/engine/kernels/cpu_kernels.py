"""The engine's native CPU kernels (the C++ sources beside this file): decode attention read in place from the
paged cache, linear layers over float32 weights and over GGUF's block-quantized weights (decode-sized inputs, and a
GEMM for prompt chunks), and a Llama-family decoder stack for decode steps.

Built with the machine's C++ compiler by `make install` (`tritonllm build-kernels`) and cached under
`.cache/torch_extensions` (or $TORCH_EXTENSIONS_DIR); a model's load then only loads them (or builds them, when
the sources changed since). Where they cannot be built, `native()` is
None: attention takes the pure-PyTorch path, which gives the same results more slowly, and quantized weights are
dequantized at load.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from tritonllm.engine.kernels.kernel_build_progress import KernelBuildProgress

log = logging.getLogger(__name__)

KERNELS = (
    "paged_decode_attention.cpp",
    "dense_linear.cpp",
    "panel_gemm.cpp",
    "bfloat16_linear.cpp",
    "bfloat16_tiles.cpp",
    "greedy_screen.cpp",
    "quantized_linear.cpp",
    "quantized_linear_int8.cpp",
    "gguf_linear.cpp",
    "decoder_layers.cpp",
    "module.cpp",
)
KERNEL_FOLDER = Path(__file__).parent  # the C++ sources and headers beside this module
SOURCES = [KERNEL_FOLDER / name for name in KERNELS]
CACHE = Path(__file__).resolve().parents[3] / ".cache" / "torch_extensions"
DISABLE_ENV = "TRITONLLM_NO_NATIVE_KERNELS"
NAME = "tritonllm_cpu_kernels"
# "avx2" builds the kernels for x86-64-v3 (AVX2, FMA, F16C, BMI2) whatever this CPU offers, into a cache of their
# own: their AVX2 paths, which an AMD EPYC before Zen 4 runs, measured and tested on a machine with AVX-512.
ISA_ENV = "TRITONLLM_CPU_ISA"
ISAS = {"native": ("-march=native", NAME), "avx2": ("-march=x86-64-v3", f"{NAME}_avx2")}


def native_sources() -> list[Path]:
    """Every C++ source and header the build reads."""
    return [*KERNEL_FOLDER.glob("*.cpp"), *KERNEL_FOLDER.glob("*.h")]


@functools.cache
def native():
    """The built module (`paged_decode_attention`, `dense_linear`, `panel_linear`, `quantized_linear`,
    `quantized_panel_linear`, `dequantize`, `DecoderLayers`), or None."""
    if os.environ.get(DISABLE_ENV):
        return None
    isa()  # a misspelt instruction set is an error, not a silent fall back to the PyTorch paths
    try:
        return build()
    except Exception as e:  # no compiler, headers or ninja: the PyTorch path still works
        log.warning("native CPU kernels unavailable (%s); using PyTorch paths", e)
        return None


def isa() -> str:
    """The instruction sets $TRITONLLM_CPU_ISA names (native when unset); a value outside ISAS is an error."""
    name = os.environ.get(ISA_ENV) or "native"
    if name not in ISAS:
        raise ValueError(f"{ISA_ENV}={name!r}: expected one of {', '.join(ISAS)}")
    return name


def target() -> tuple[str, str]:
    """The compiler's -march flag and the module's name for $TRITONLLM_CPU_ISA."""
    return ISAS[isa()]


def build_dir() -> Path:
    """Where the kernels for $TRITONLLM_CPU_ISA are built and cached."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(CACHE))
    return Path(os.environ["TORCH_EXTENSIONS_DIR"]) / target()[1]


def is_built() -> bool:
    """Whether a build for $TRITONLLM_CPU_ISA is cached, newer than every source (else `build` compiles)."""
    module = build_dir() / f"{target()[1]}.so"
    return module.exists() and all(module.stat().st_mtime >= source.stat().st_mtime for source in SOURCES)


def build(progress: Callable[[str], None] | None = None):
    """Compiles the kernels for this machine's CPU (or the instruction sets $TRITONLLM_CPU_ISA names), or loads the
    build already cached; raises when it cannot. `make install` runs it (`tritonllm build-kernels`), so that a
    model's load only loads them. `progress` hears how far a compile has got, every few seconds."""
    import ninja
    from torch.utils.cpp_extension import load

    march, name = target()
    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    told = KernelBuildProgress(folder, len(SOURCES), progress) if progress else contextlib.nullcontext()
    with _exclusive(folder / "build.flock"), _path_first(ninja.BIN_DIR), told:
        # torch's own lock file outlives a builder that was killed, and then every later load waits for it
        # forever; whoever holds it also holds build.flock, which the kernel releases when its holder dies.
        (folder / "lock").unlink(missing_ok=True)
        return load(
            name=name,
            sources=[str(source) for source in SOURCES],
            extra_cflags=["-O3", march, "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            verbose=False,
        )


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _path_first(directory: str) -> Iterator[None]:
    """Puts the pip-installed ninja first on PATH while building: a system ninja of another version, found first by
    some processes and not by others (tritonserver's stubs run with the venv's bin/ first), makes each rebuild what
    the other built, a minute every time."""
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([directory, saved])
    try:
        yield
    finally:
        os.environ["PATH"] = saved
