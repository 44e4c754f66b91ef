"""Swaps a dequantized GGUF model's nn.Linear layers (and its input embedding, where the file keeps it in blocks)
for QuantizedLinear ones holding the file's blocks, and frees the float32 copies.

The swap is checked, not trusted: the blocks, read through the same row order transformers applied (llama.cpp
stores Q and K rows permuted), must dequantize to exactly the float32 weight they replace, and the kernel on them
must compute probes as the float32 layer does, else the layer keeps its float32 weight and the log says why. The
verdict is kept for later starts with the same file, weights, code and kernel build (_verdict_file).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers import quantized_linear
from tritonllm.engine.layers.gguf_linear import GGUFLinear
from tritonllm.engine.layers.quantized_linear import QuantizedEmbedding, QuantizedLinear, kernel_matches
from tritonllm.formats import gguf, gguf_blocks, gguf_layout, model_cache
from tritonllm.formats.gguf_blocks import BLOCK, from_gguf
from tritonllm.formats.gguf_layout import GGUFLayout

log = logging.getLogger(__name__)


def quantize_from_gguf(
    model: torch.nn.Module, gguf_file: Path, int8_activations: bool = False, layout: GGUFLayout | None = None
) -> int:
    """Swaps the model's nn.Linear layers for QuantizedLinear ones built from the GGUF file the model was
    dequantized from, and its input embedding for a QuantizedEmbedding where the file keeps it in blocks;
    returns how many linear layers were swapped. `layout`: gguf_layout's, where the caller has it already."""
    layout = layout if layout is not None else gguf_layout.gguf_layout(model, gguf_file)
    _, tensors = gguf.read_tensors(gguf_file)
    linears = {
        f"{name}.weight": (module, name)
        for name, module in model.named_modules()
        if type(module) is torch.nn.Linear and module.in_features % BLOCK == 0
    }
    # A tied output layer shares the embedding's tensor; the map names the embedding.
    by_weight = {id(module.weight): key for key, (module, _) in linears.items()}
    params = dict(model.named_parameters(remove_duplicate=False))
    embedding = model.get_input_embeddings()
    embedding_name = next(name for name, module in model.named_modules() if module is embedding)
    verdict_file = _verdict_file(model, gguf_file, int8_activations)
    verdict = json.loads(verdict_file.read_text()) if verdict_file and verdict_file.is_file() else None
    swapped, refused, other_formats = 0, [], Counter()
    for tensor in tensors:
        hf_name, order = layout.get(tensor.name, (None, None))
        key = hf_name if hf_name in linears else by_weight.get(id(params.get(hf_name)))
        embeds = type(embedding) is torch.nn.Embedding and hf_name == f"{embedding_name}.weight"
        if key is None and not embeds:
            continue
        blocks = from_gguf(tensor.type_name, tensor.data)
        if blocks is None:
            if tensor.type_name not in ("F32", "F16", "BF16"):
                other_formats[tensor.type_name] += 1
            continue
        name = linears[key][1] if key else embedding_name
        weight = (linears[key][0] if key else embedding).weight.detach()
        if order is not None:
            blocks = blocks.rows(np.asarray(order))
        checked = verdict is None
        if blocks.shape != tuple(weight.shape) or (
            not torch.equal(blocks.dequantize(), weight) if checked else name in verdict["refused"]
        ):
            refused.append(name)
            continue
        if key:
            layer = QuantizedLinear(blocks, linears[key][0].bias, int8_activations)
            if checked and not kernel_matches(layer, weight, linears[key][0].bias):
                refused.append(name)
                continue
            replace_module(model, name, layer)
            swapped += 1
        if embeds:  # the same blocks, shared with a tied output layer
            replace_module(model, embedding_name, QuantizedEmbedding(blocks))
    if verdict is None and verdict_file:
        model_cache.write(verdict_file, json.dumps({"refused": refused}))
    if other_formats:
        log.warning(
            "%d layers run dequantized: no kernel here reads their GGUF formats %s",
            sum(other_formats.values()),
            dict(other_formats),
        )
    if refused:
        log.warning(
            "%d layers keep float32 weights: their GGUF blocks, or the kernel on them, do not match them (%s)",
            len(refused),
            refused,
        )
    return swapped


def recut_for_int8_activations(model: torch.nn.Module) -> int:
    """`int8_activations` on a model that reads a GGUF file in place (gguf_linear.py): each layer whose type the
    8-bit kernel reads (quantized_linear.py's layouts, one scale per 32 values: Q8_0, Q4_0, Q4_1, Q5_0, Q4_K) is
    recut into that layout, a copy of its blocks (never float32), and multiplies 8-bit inputs; the others keep
    float32 inputs on the file's blocks. Returns how many layers were recut."""
    recut = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, GGUFLinear):
            continue
        blocks = from_gguf(module.type_name, module.raw.numpy())
        if blocks is None or blocks.scales.shape[1] * BLOCK != module.in_features:
            continue
        replace_module(model, name, QuantizedLinear(blocks, module.bias, int8_activations=True))
        recut += 1
    return recut


def _verdict_file(model: torch.nn.Module, gguf_file: Path, int8_activations: bool) -> Path | None:
    """Where the load's checks of a file's blocks are kept: they compare the same blocks with the same float32
    weights through the same kernel build on every start (seconds on a 0.5B model), so a start with the same
    file and float32 weights, this code, the same kernel build and library versions reads the layers they
    refused instead. None without the native kernels: nothing is kept."""
    module = cpu_kernels.native()
    if module is None:
        return None
    kernels = Path(module.__file__)
    weights = sorted(Path(model.name_or_path).glob("*.safetensors"))
    identity = [
        [(str(w), w.stat().st_size, w.stat().st_mtime_ns) for w in weights],
        str(gguf_file.resolve()),
        gguf_file.stat().st_size,
        gguf_file.stat().st_mtime_ns,
        *(hashlib.sha256(Path(m.__file__).read_bytes()).hexdigest() for m in (gguf_blocks, quantized_linear)),
        hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        str(kernels),
        kernels.stat().st_mtime_ns,
        int8_activations,
        torch.__version__,
        version("transformers"),
        version("gguf"),
    ]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
    return model_cache.cache_dir() / f"{key}.gguf_blocks_checked.json"


def replace_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    """`module` in the place of model's submodule `name`."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
