"""GGUF's block-quantized formats (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K) as the two layouts the engine's kernels
read: 8-bit values, or 4-bit values with a min, in blocks of 32 along a row (Q5_0 and Q6_K widened to 8 bits,
Q6_K with a scale per 16 values, Q4_K recut into 32-value blocks), each dequantizing exactly as gguf-py does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32


@dataclass
class BlockQuantized:
    """A weight [N, K] in blocks of 32 along K: w = scale * q (+ min for 4 bits), q packed as
    engine/kernels/quantized_linear.cpp describes."""

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
