"""The KV pool on CPU: zeros that take memory only as blocks are written."""

from __future__ import annotations

import torch

from tritonllm.engine.layers.paged_attention import KVCache

GIB = 1 << 30


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def test_a_cpu_pool_is_zeros_that_take_memory_only_once_written():
    before = resident_bytes()
    # 1 GiB in all: 4 layers, keys and values, 4096 blocks of 16 tokens, 8 KV heads of 64
    cache = KVCache.allocate(4, 4096, 16, 8, 64, torch.float32, torch.device("cpu"))
    assert sum(t.numel() * t.element_size() for t in (*cache.key, *cache.value)) == GIB
    assert resident_bytes() - before < GIB // 16
    for layer in (*cache.key, *cache.value):
        assert layer.shape == (4096, 16, 8, 64) and layer.is_contiguous()
        layer[7].fill_(1.5)  # a block written: its own pages only
    assert resident_bytes() - before < GIB // 16
    assert torch.count_nonzero(cache.key[2]) == 16 * 8 * 64 and cache.value[3][7].eq(1.5).all()
    assert torch.count_nonzero(cache.key[0][8:]) == 0
