"""A GGUF model's linear layers with their weights kept in the file's block-quantized formats.

llama.cpp users serve Q8_0 and Q4 files because a decode step streams every weight from memory: 8 bits are a
quarter of float32's bytes and 4 bits an eighth. The engine loads such a model as transformers dequantizes it
(formats/gguf.py), then swaps each nn.Linear whose GGUF tensor is Q8_0, Q4_0, Q4_1, Q5_0, Q4_K or Q6_K for a
QuantizedLinear holding that tensor's blocks (Q5_0 and Q6_K widened to 8 bits, Q6_K with a scale per 16 values,
Q4_K recut into 32-value blocks of 4 bits), and frees the float32 copy; the input embedding, when the file keeps
it in blocks (or ties it to a block-quantized output layer), becomes a QuantizedEmbedding that reads the same
blocks.
The swap is checked, not trusted: the blocks, read through the same row order transformers applied (llama.cpp
stores Q and K rows permuted), must dequantize to exactly the float32 weight they replace, and the kernel on them
must compute probes as the float32 layer does, else the layer keeps its float32 weight and the log says why. The
verdict is kept for later starts with the same file, weights, code and kernel build (_verdict_file).

Up to GEMM_ROWS - 1 rows (decode steps, and prompt chunks up to 64 tokens) run the native kernel over the
blocks; more rows go to the float32 GEMM for prompts (kernels/panel_gemm.cpp), which widens each panel of weight
rows as it takes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tritonllm.engine import cpu_kernels
from tritonllm.formats import gguf, model_cache

log = logging.getLogger(__name__)

BLOCK = 32
# From this many rows up (past the rows of a decode step, as for float32) the prompt GEMM beats the block kernel
# (which widens a chunk of weight rows at a time into the decode tiles). SmolLM2's 120 Q4_1 matrices, AMD EPYC Zen
# 4, ms for the block kernel / the prompt GEMM: 65 rows 76.6 / 77.3, 128 144.3 / 137.8, 256 288.8 / 265.9, 512
# 589.6 / 537.5, 2048 2837.6 / 2102.4; built for AVX2 only: 64 76.6 / 73.3, 128 144.8 / 136.3, 256 303.4 / 260.6,
# 512 666.8 / 527.2; int8_activations' kernel at 128 rows 187.0. Before the prompt GEMM widened a panel at a time,
# the weight was dequantized whole for MKL, and the block kernel stayed faster up to 511 rows.
GEMM_ROWS = 65
_NO_BIAS = torch.empty(0)


@dataclass
class BlockQuantized:
    """A weight [N, K] in blocks of 32 along K: w = scale * q (+ min for 4 bits), q packed as quantized_linear.cpp
    describes."""

    qweight: torch.Tensor  # int8 [N, K] (8 bits) or uint8 [N, K / 2] (4 bits)
    scales: torch.Tensor  # float32 [N, K / 32], or [N, K / 16] for 8 bits with a scale per 16 values (Q6_K)
    mins: torch.Tensor  # float32 [N, K / 32]; empty for 8 bits
    bits: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.qweight.shape[0], self.qweight.shape[1] * 8 // self.bits

    def rows(self, order: np.ndarray | torch.Tensor) -> BlockQuantized:
        pick = torch.as_tensor(order)
        mins = self.mins[pick] if self.bits == 4 else self.mins
        return BlockQuantized(self.qweight[pick].contiguous(), self.scales[pick].contiguous(), mins, self.bits)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K], computed as gguf-py computes it (a product, then a sum, in float32)."""
        n, k = self.shape
        blocks = k // BLOCK
        if self.bits == 8:
            q = self.qweight.view(n, self.scales.shape[1], -1).float()
            return (self.scales[:, :, None] * q).view(n, k)
        packed = self.qweight.view(n, blocks, BLOCK // 2)
        q = torch.cat([packed & 0x0F, packed >> 4], dim=2).float()
        return (self.scales[:, :, None] * q + self.mins[:, :, None]).view(n, k)


def from_gguf(kind: str, data: np.ndarray) -> BlockQuantized | None:
    """A GGUF tensor's raw rows (uint8 [N, bytes per row]) as BlockQuantized, or None for another format."""
    n = data.shape[0]
    if kind == "Q8_0":  # per block: float16 scale, 32 int8
        blocks = data.reshape(n, -1, 34)
        scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0]
        q = blocks[:, :, 2:].reshape(n, -1).view(np.int8)
        return BlockQuantized(torch.from_numpy(q.copy()), _floats(scales), torch.empty(0), 8)
    if kind == "Q4_0":  # per block: float16 scale, 16 bytes of nibbles; w = scale * (q - 8)
        blocks = data.reshape(n, -1, 18)
        scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0]
        q = blocks[:, :, 2:].reshape(n, -1)
        return BlockQuantized(torch.from_numpy(q.copy()), _floats(scales), -8 * _floats(scales), 4)
    if kind == "Q4_1":  # per block: float16 scale, float16 min, 16 bytes of nibbles
        blocks = data.reshape(n, -1, 20)
        halves = blocks[:, :, :4].copy().view(np.float16)
        q = blocks[:, :, 4:].reshape(n, -1)
        return BlockQuantized(torch.from_numpy(q.copy()), _floats(halves[:, :, 0]), _floats(halves[:, :, 1]), 4)
    if kind == "Q5_0":  # per block: float16 scale, 32 high bits, 16 bytes of low nibbles; w = scale * (q - 16)
        blocks = data.reshape(n, -1, 22)
        scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0]
        high = np.unpackbits(blocks[:, :, 2:6], axis=2, bitorder="little")  # bit i of the 32: value i
        q = _nibbles(blocks[:, :, 6:]) | (high << 4)
        values = torch.from_numpy((q.astype(np.int8) - 16).reshape(n, -1))
        return BlockQuantized(values, _floats(scales), torch.empty(0), 8)
    if kind == "Q4_K":
        return _q4_k(data)
    if kind == "Q6_K":
        return _q6_k(data)
    return None


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[..., 16] bytes of a 32-value block in GGUF's order (byte j: value j low, value j + 16 high) -> [..., 32]."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _q4_k(data: np.ndarray) -> BlockQuantized:
    """Q4_K as 32-value blocks of 4 bits: a super-block of 256 values holds float16 d and dmin, 8 six-bit scales
    and mins, and nibbles where byte j of each 32-byte run holds value j of one block (low) and of the next (high);
    w = (d * scale) * q - dmin * min. Each block's scale d * scale and min -(dmin * min) are float32 products of at
    most 17 significant bits, so exact, and scale * q + min is then gguf-py's d * q - dm to the bit."""
    from gguf import quants

    n = data.shape[0]
    supers = data.reshape(n, -1, 144)
    halves = supers[:, :, :4].copy().view(np.float16).astype(np.float32)
    sc, mn = quants.Q4_K.get_scale_min(supers[:, :, 4:16].reshape(-1, 12))
    scales = halves[:, :, :1] * sc.reshape(n, -1, 8).astype(np.float32)
    mins = -(halves[:, :, 1:] * mn.reshape(n, -1, 8).astype(np.float32))
    runs = supers[:, :, 16:].reshape(n, -1, 4, 32)
    values = np.stack([runs & 0x0F, runs >> 4], axis=3).reshape(n, -1, 32)  # [N, blocks, 32], value order
    packed = values[:, :, :16] | (values[:, :, 16:] << 4)  # GGUF's 32-value block order, as Q4_1 keeps it
    return BlockQuantized(
        torch.from_numpy(packed.reshape(n, -1).copy()),
        torch.from_numpy(scales.reshape(n, -1).copy()),
        torch.from_numpy(mins.reshape(n, -1).copy()),
        4,
    )


def _q6_k(data: np.ndarray) -> BlockQuantized:
    """Q6_K as 8-bit blocks with a scale per 16 values: a super-block of 256 values holds 6-bit values (4 low bits
    in 128 bytes, 2 high bits in 64), 16 int8 scales and a float16 d; w = (d * scale) * (q - 32), gguf-py's
    arithmetic, d * scale being exact in float32 (at most 19 significant bits)."""
    n = data.shape[0]
    supers = data.reshape(-1, 210)  # as gguf-py splits each super-block
    low = (supers[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (supers[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(-1, 8, 32) | (high.reshape(-1, 8, 32) << 4)).astype(np.int8) - np.int8(32)
    d = supers[:, 208:].copy().view(np.float16).astype(np.float32)
    scales = d * supers[:, 192:208].view(np.int8).astype(np.float32)
    values, scales = torch.from_numpy(q.reshape(n, -1)), torch.from_numpy(scales.reshape(n, -1))
    return BlockQuantized(values, scales, torch.empty(0), 8)


def _floats(halves: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(halves.astype(np.float32))


class QuantizedLinear(torch.nn.Module):
    """`int8_activations`: decode-sized inputs are rounded to 8 bits per block and multiplied with integer dot
    products (kernels/quantized_linear_int8.cpp), as llama.cpp does; faster, not exact. Weights with a scale per 16
    values (Q6_K) keep float32 inputs: that kernel reads one weight scale per 32 values."""

    def __init__(self, weight: BlockQuantized, bias: torch.Tensor | None, int8_activations: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bits = weight.bits
        self.int8_activations = int8_activations and weight.scales.shape[1] * BLOCK == self.in_features
        self.register_buffer("qweight", weight.qweight)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("mins", weight.mins)
        self.register_buffer("bias", None if bias is None else bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = cpu_kernels.native()
        flat = x.reshape(-1, self.in_features).contiguous()
        if flat.shape[0] >= GEMM_ROWS:
            bias = _NO_BIAS if self.bias is None else self.bias
            out = kernels.quantized_panel_linear(flat, self.qweight, self.scales, self.mins, self.bits, bias)
            return out.view(*x.shape[:-1], self.out_features)
        multiply = kernels.quantized_linear_int8 if self.int8_activations else kernels.quantized_linear
        out = multiply(flat, self.qweight, self.scales, self.mins, self.bits)
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)


def side_by_side(layers: list[QuantizedLinear]) -> QuantizedLinear | None:
    """One layer whose output rows are the given layers' in order (a block's q/k/v or gate/up), so that a step
    makes one call and one pass over the input for them; None when they differ in format, input or bias. Each
    output row is computed as its own layer computes it. The layers keep working: their buffers become views of
    the joined rows, so the weights are held once."""
    first = layers[0]
    kinds = {
        (q.bits, q.in_features, q.scales.shape[1], q.int8_activations, q.bias is None, q.mins.numel() == 0)
        for q in layers
    }
    if len(kinds) != 1:
        return None
    weight = BlockQuantized(
        torch.cat([q.qweight for q in layers]),
        torch.cat([q.scales for q in layers]),
        torch.cat([q.mins for q in layers]) if first.mins.numel() else first.mins,
        first.bits,
    )
    bias = None if first.bias is None else torch.cat([q.bias for q in layers])
    joined = QuantizedLinear(weight, bias, first.int8_activations)
    start = 0
    for q in layers:
        rows = slice(start, start + q.out_features)
        q.qweight, q.scales = joined.qweight[rows], joined.scales[rows]
        if q.mins.numel():
            q.mins = joined.mins[rows]
        if q.bias is not None:
            q.bias = joined.bias[rows]
        start = rows.stop
    return joined


@contextmanager
def float_inputs(model: torch.nn.Module) -> Iterator[None]:
    """The model's block layers multiply float32 inputs for the duration, whatever `int8_activations` says. The model
    check runs so: with 8-bit inputs, two correct paths (the native stack and the modules) differ by their rounding,
    since a last-bit difference upstream flips a value's rounding and the flip grows through the layers (0.3-3.3 of
    SmolLM2's logits apart, where float32 keeps them 4e-5 apart), so only float32 inputs hold a path to exactness.
    The 8-bit kernel is checked on its own, layer by layer (kernel_matches)."""
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear) and m.int8_activations]
    for layer in layers:
        layer.int8_activations = False
    try:
        yield
    finally:
        for layer in layers:
            layer.int8_activations = True


class QuantizedEmbedding(torch.nn.Module):
    """An input embedding kept in its GGUF blocks (shared with a tied output layer's): a step dequantizes only
    the rows of its tokens, exactly as the whole table would dequantize."""

    def __init__(self, weight: BlockQuantized) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.bits = weight.bits
        self.register_buffer("qweight", weight.qweight)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("mins", weight.mins)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        table = BlockQuantized(self.qweight, self.scales, self.mins, self.bits)
        return table.rows(ids.reshape(-1)).dequantize().view(*ids.shape, self.embedding_dim)


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


def quantize_from_gguf(
    model: torch.nn.Module, gguf_file: Path, int8_activations: bool = False, layout: GGUFLayout | None = None
) -> int:
    """Swaps the model's nn.Linear layers for QuantizedLinear ones built from the GGUF file the model was
    dequantized from, and its input embedding for a QuantizedEmbedding where the file keeps it in blocks;
    returns how many linear layers were swapped. `layout`: gguf_layout's, where the caller has it already."""
    layout = layout if layout is not None else gguf_layout(model, gguf_file)
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
            _replace(model, name, layer)
            swapped += 1
        if embeds:  # the same blocks, shared with a tied output layer
            _replace(model, embedding_name, QuantizedEmbedding(blocks))
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


def gguf_to_hf_names(model: torch.nn.Module, processor) -> dict[str, str]:
    """transformers' map of the file's tensor names to the model's, with gguf-py's name table built once: the
    map builds it again for each of the model's modules (319 times, 2.6 s, on Qwen2.5-0.5B)."""
    import gguf as gguf_py
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    table = gguf_py.get_tensor_name_map
    gguf_py.get_tensor_name_map = functools.lru_cache(maxsize=None)(table)
    try:
        return get_gguf_hf_weights_map(model, processor)
    finally:
        gguf_py.get_tensor_name_map = table


# The kernel's output on a probe against torch's matmul on the float32 weight, as a fraction of the largest
# output: float32 sums differ in order only; 8-bit inputs round each value by up to 1/254 of its block's largest.
KERNEL_TOLERANCE = 1e-4
INT8_KERNEL_TOLERANCE = 3e-2
PROBE_ROWS = (1, 3, 8)  # the few-row and the block paths of the kernel (GEMM_ROWS and up is the prompt GEMM)


@torch.inference_mode()
def kernel_matches(layer: QuantizedLinear, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the kernel that will run computes the layer within tolerance of its float32 weight: the load
    holds the arithmetic that serves, not only the blocks' dequantization, to the weight it replaces."""
    generator = torch.Generator().manual_seed(0)
    tolerance = INT8_KERNEL_TOLERANCE if layer.int8_activations else KERNEL_TOLERANCE
    for rows in PROBE_ROWS:
        x = torch.randn(rows, layer.in_features, generator=generator)
        exact = F.linear(x, weight, bias)
        if not (layer(x) - exact).abs().max().item() <= tolerance * exact.abs().max().item():
            return False  # quantize_from_gguf's warning names the layer
    return True


def _replace(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
