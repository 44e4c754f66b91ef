"""Touching a server's whole KV pool: the llm maps its pool lazily (a page costs memory once a block on it is first
written) and the prefix cache hands out blocks never used before ahead of reusing freed ones, so mixed traffic
makes the whole pool resident within minutes. A benchmark of memory fills it first, as a busy hour would."""

from __future__ import annotations

import asyncio
import random
import urllib.request

import httpx

PROMPT_TOKENS = 4000  # the pool is filled with distinct prompts of this length
BLOCK_TOKENS = 16


def metric_sum(metrics_port: int, *names: str) -> float:
    """The sum of the server's samples of these metrics, over every instance."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(tuple(f"{n}{{" for n in names))]
    if not values:
        raise RuntimeError(f"the server exports none of {', '.join(names)}")
    return sum(values)


def pool_tokens(metrics_port: int) -> int:
    """The llm's KV pool in tokens: its blocks (used and free), from its metrics."""
    blocks = metric_sum(metrics_port, "tritonllm_kv_blocks_used", "tritonllm_kv_blocks_free")
    if not blocks:
        raise RuntimeError("the llm's metrics show no KV blocks")
    return int(blocks) * BLOCK_TOKENS


async def fill(base_url: str, model: str, tokens: int) -> None:
    """Prefills distinct random prompts that together need more than `tokens` of KV, two at a time."""
    rng = random.Random(-1)
    count = tokens // PROMPT_TOKENS + 2
    prompts = [[rng.randrange(100, 40000) for _ in range(PROMPT_TOKENS)] for _ in range(count)]
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        for pair in range(0, len(prompts), 2):
            bodies = [{"model": model, "prompt": p, "max_tokens": 1} for p in prompts[pair : pair + 2]]
            for response in await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies)):
                response.raise_for_status()
