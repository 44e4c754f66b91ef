"""Memory of the whole server, side by side with llama.cpp's server and vLLM's CPU build, on SmolLM2-135M-Instruct.

    make bench-footprint                  # writes bench/results/footprint.{md,json}
    .venv/bin/python bench/footprint.py --skip-vllm

Every server holds the same KV capacity: 16,384 tokens (llama.cpp `-c 16384` over 32 slots; this project
`--num-kv-blocks 1024` of 16 tokens; vLLM 1 GiB of KV space, its smallest setting above that, 22,000 tokens in
float32). Each server runs alone: started, left idle 5 s, its processes' memory read (RSS, and PSS, which splits
pages the processes share, such as libraries, between them); then W1 (32 concurrent streams, 64-token prompts,
128 new tokens) with the summed RSS sampled every 0.1 s for its peak; then stopped. fp32 (llama.cpp on an f32
GGUF made from the same directory) and the wheel's Q4_1 file (llama.cpp and this project on the file as it is).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
from serving_cost import process_name

CONTEXT_TOKENS = 16384
BLOCK_SIZE = 16
MB = 2**20


@dataclass
class Footprint:
    case: str
    idle_rss_mb: dict[str, float] = field(default_factory=dict)  # by process role
    idle_pss_mb: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: float = 0.0  # summed over the processes, during W1
    after_rss_mb: float = 0.0  # summed, idle again after W1


def processes(server: Server) -> list[psutil.Process]:
    root = psutil.Process(server.process.pid)
    return [root, *root.children(recursive=True)]


def role(process: psutil.Process, ours_: bool) -> str:
    if ours_:
        return process_name(process)
    return process.name()


def idle_memory(server: Server, ours_: bool, result: Footprint) -> None:
    rss, pss = defaultdict(float), defaultdict(float)
    for process in processes(server):
        with contextlib.suppress(psutil.Error):
            info = process.memory_full_info()
            rss[role(process, ours_)] += info.rss / MB
            pss[role(process, ours_)] += info.pss / MB
    result.idle_rss_mb, result.idle_pss_mb = dict(rss), dict(pss)


def summed_rss(server: Server) -> float:
    total = 0
    for process in processes(server):
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total / MB


def peak_during(server: Server, work) -> float:
    peak, done = 0.0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, summed_rss(server))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return peak


def measure(case: str, start, make_run, ours_: bool, prompts) -> Footprint:
    print(f"[footprint] {case}", file=sys.stderr, flush=True)
    server, port = start()
    try:
        result = Footprint(case)
        time.sleep(5)
        idle_memory(server, ours_, result)
        run = make_run(case, port)(WORKLOADS["W1"])
        result.peak_rss_mb = peak_during(server, lambda: run(*next(prompts)))
        time.sleep(3)
        result.after_rss_mb = summed_rss(server)
        return result
    finally:
        server.stop()


def ours_server(model: Path, *flags: str):
    def start() -> tuple[Server, int]:
        log = RESULTS / "tritonllm-footprint.log.tmp"
        server, shim_port, _ = ours(
            log, model=model, flags=("--num-kv-blocks", str(CONTEXT_TOKENS // BLOCK_SIZE), *flags)
        )
        return server, shim_port

    return start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-vllm", action="store_true", help="leave vLLM out (its start takes minutes)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    prompts = fresh_prompts(AutoTokenizer.from_pretrained(MODEL), WORKLOADS["W1"])
    sections: dict[str, list[Footprint]] = {"fp32": [], "Q4_1": []}
    fp32 = sections["fp32"]
    fp32.append(measure("llama.cpp", lambda: llama_cpp(f32_gguf(), CONTEXT_TOKENS), llama_cpp_case, False, prompts))
    if not args.skip_vllm:
        fp32.append(measure("vLLM CPU", lambda: vllm(kv_cache_gib=1), shim_case, False, prompts))
    fp32.append(measure("this project", ours_server(MODEL), shim_case, True, prompts))
    fp32.append(measure("this project, --no-embedding", ours_server(MODEL, "--no-embedding"), shim_case, True, prompts))
    q4 = sections["Q4_1"]
    q4.append(measure("llama.cpp", lambda: llama_cpp(Q4_1_GGUF, CONTEXT_TOKENS), llama_cpp_case, False, prompts))
    q4.append(measure("this project", ours_server(Q4_1_GGUF), shim_case, True, prompts))
    q4.append(
        measure("this project, --no-embedding", ours_server(Q4_1_GGUF, "--no-embedding"), shim_case, True, prompts)
    )
    write_report(sections)


def write_report(sections: dict[str, list[Footprint]]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "footprint.json").write_text(
        json.dumps({"machine": machine(), **{k: [asdict(f) for f in v] for k, v in sections.items()}}, indent=1)
    )
    lines = [
        "# Footprint: the whole server's memory, SmolLM2-135M-Instruct, 16,384 tokens of KV capacity",
        "",
        f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`. Machine: `{json.dumps(machine())}`.",
        "MB = MiB. Idle: 5 s after the server is healthy. Peak: summed RSS during W1 (32 streams, 128 new tokens).",
        "",
    ]
    for name, results in sections.items():
        llama = sum(results[0].idle_rss_mb.values())
        lines += [
            f"## {name}",
            "",
            "| server | idle RSS | ÷ llama.cpp | idle PSS | peak RSS in W1 | RSS after W1 | idle RSS by process |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in results:
            rss = sum(f.idle_rss_mb.values())
            parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(f.idle_rss_mb.items(), key=lambda kv: -kv[1]))
            lines.append(
                f"| {f.case} | {rss:.0f} | {rss / llama:.2f} | {sum(f.idle_pss_mb.values()):.0f} | "
                f"{f.peak_rss_mb:.0f} | {f.after_rss_mb:.0f} | {parts} |"
            )
        lines.append("")
    (RESULTS / "footprint.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
