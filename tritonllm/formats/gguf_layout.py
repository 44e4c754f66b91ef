"""Where a GGUF file's matrices go in the HF model transformers dequantizes it into, and in which row order."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from tritonllm.formats import gguf

# each of the file's matrices: the model's name for it, and the model's order of its rows (None: the file's)
GGUFLayout = dict[str, tuple[str, list[int] | None]]


def gguf_layout(model: torch.nn.Module, gguf_file: Path) -> GGUFLayout:
    """Where the file's matrices go in the model, as transformers maps and reorders them when it dequantizes the
    file (llama.cpp's converter permutes the rows of Llama's q and k projections)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    architecture, tensors = gguf.read_tensors(gguf_file)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    hf_names = gguf_to_hf_names(model, processor)
    layout = {}
    for tensor in tensors:
        if tensor.name in hf_names and tensor.data.ndim == 2:
            rows = tensor.data.shape[0]
            order = processor.process(np.arange(rows)[:, None], tensor.name).weights[:, 0].tolist()
            layout[tensor.name] = (hf_names[tensor.name], None if order == list(range(rows)) else order)
    return layout


def gguf_to_hf_names(model: torch.nn.Module, processor) -> dict[str, str]:
    """transformers' map of the file's tensor names to the model's. gguf-py's name table is memoized for the
    call: transformers' map would build it again for each of the model's modules."""
    import gguf as gguf_py
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    table = gguf_py.get_tensor_name_map
    gguf_py.get_tensor_name_map = functools.lru_cache(maxsize=None)(table)
    try:
        return get_gguf_hf_weights_map(model, processor)
    finally:
        gguf_py.get_tensor_name_map = table
