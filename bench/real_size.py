"""Real-size GGUF files (bench/real_size_models.py) served by this project and by llama.cpp's server, one server at a
time, side by side: time to ready on a second start, the peak memory of every process of the server while it
serves 16 streams, and tokens/s for one request and for 16 streams (64-token prompts, 64 new tokens, greedy, EOS
ignored), and for one request the share of the memory limit reached (bench/memory_limit.py: the weight bytes a
token reads times tokens/s, over the read bandwidth measured before any server starts).

Both servers hold 8,192 tokens of 16-bit KV (llama.cpp `-np 16 -c 8192`, its default f16; this project 512 blocks
of 16 tokens in bfloat16), both on every core.

    .venv/bin/python bench/real_size.py --shape 1b --types Q4_K_M Q5_K_M Q8_0 IQ4_XS
    .venv/bin/python bench/real_size.py --shape 8b --types Q4_K_M --skip-speed
    .venv/bin/python bench/real_size.py --shape 1b --servers "this project" "this project, dequantized folder"
    .venv/bin/python bench/real_size.py --shape 1b --folder

--folder serves the shape's HF folder in bfloat16 (weights and KV) instead of a GGUF file, beside vLLM CPU.

The dequantized folder is the way a GGUF file was served before it was read in place (an A/B on one machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from footprint import peak_during
from memory_limit import fraction, read_bandwidth
from peers import MODEL, STARTS, Server, fresh_prompts, llama_cpp, llama_cpp_case, ours, shim_case, vllm
from real_size_models import gguf_file, hf_folder
from run import RESULTS, Workload, machine

from tritonllm.formats import gguf

CONTEXT_TOKENS = 8192
STREAMS = 16
ONE = Workload(requests=1, prompt_tokens=64, new_tokens=64)
MANY = Workload(requests=STREAMS, prompt_tokens=64, new_tokens=64)
BEFORE = "this project, dequantized folder"
VLLM = "vLLM CPU"


@dataclass
class Row:
    file: str
    size_mb: float
    server: str
    ready_s: list[float]  # every start: the first (cold caches, folder written) and the second
    peak_rss_mb: float | None = None
    one_tokens_per_s: float | None = None
    many_tokens_per_s: float | None = None
    one_memory_limit: float | None = None  # the share of bandwidth ÷ bytes a token reads that one request reaches


def start(name: str, file: Path) -> tuple[Server, int, bool]:
    """The server `name` on `file` (a GGUF file, or a HF folder served in bfloat16); its port and whether it is
    this project's."""
    if name == "llama.cpp":
        server, port = llama_cpp(file, CONTEXT_TOKENS, STREAMS, log=f"{log_name(name)}.log.tmp")
        return server, port, False
    if name == VLLM:  # its KV space is whole GiB: 1 holds the 8,192 tokens of the 1B and 3B shapes
        server, port = vllm(kv_cache_gib=1, model=file, dtype="bfloat16", sequences=STREAMS)
        return server, port, False
    flags = ("--num-kv-blocks", str(CONTEXT_TOKENS // 16), "--kv-cache-dtype", "bfloat16", "--no-embedding")
    flags += ("--dtype", "bfloat16") if file.is_dir() else ()
    # BEFORE: the file dequantized into a float32 folder whose layers go back into blocks, the only way before
    model = gguf.hf_model_dir(file, dequantize=True) if name == BEFORE else file
    server, port, _ = ours(RESULTS / f"{log_name(name)}.log.tmp", model=model, flags=flags)
    return server, port, True


def log_name(name: str) -> str:
    names = {"llama.cpp": "llama-server-real-size", BEFORE: "tritonllm-dequantized", VLLM: "vllm"}
    return names.get(name, "tritonllm-real-size")


def measure(name: str, file: Path, prompts, speed: bool, bandwidth: float) -> Row:
    print(f"[real-size] {file.name}: {name}", file=sys.stderr, flush=True)
    log = log_name(name)
    STARTS.pop(log, None)
    server, _, _ = start(name, file)
    server.stop()  # the first start fills the caches (the page cache with the file, the tokenizer folder)
    server, port, ours_ = start(name, file)
    size = sum(p.stat().st_size for p in file.glob("*.safetensors")) if file.is_dir() else file.stat().st_size
    row = Row(file.name, size / 2**20, name, STARTS[log])
    try:
        case = (shim_case if ours_ else llama_cpp_case)(name, port)
        case(ONE)(*next(prompts[1]))  # warm: the first request's one-time costs
        if speed:
            row.one_tokens_per_s = case(ONE)(*next(prompts[1])).tokens_per_s
            row.one_memory_limit = fraction(row.one_tokens_per_s, file, bandwidth)
        many = case(MANY)
        result = {}

        def streams() -> None:
            result["many"] = many(*next(prompts[STREAMS]))

        peak = peak_during(server, ours_, streams)
        row.peak_rss_mb = sum(peak.values())
        row.many_tokens_per_s = result["many"].tokens_per_s if speed else None
    finally:
        server.stop()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True)
    parser.add_argument("--types", nargs="+", default=["Q4_K_M"])
    parser.add_argument("--servers", nargs="+", help="default: llama.cpp's and this project's; --folder: vLLM's")
    parser.add_argument("--folder", action="store_true", help="the shape's HF folder in bfloat16, not a GGUF file")
    parser.add_argument("--skip-speed", action="store_true", help="ready time and memory alone")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = {1: fresh_prompts(tokenizer, ONE), STREAMS: fresh_prompts(tokenizer, MANY)}
    bandwidth = read_bandwidth()
    rows = []
    servers = args.servers or ([VLLM, "this project"] if args.folder else ["llama.cpp", "this project"])
    models = [hf_folder(args.shape)] if args.folder else [gguf_file(args.shape, kind) for kind in args.types]
    for file in models:
        for name in servers:
            rows.append(measure(name, file, prompts, not args.skip_speed, bandwidth))
            time.sleep(2)
    write_report(args.shape + ("-folder" if args.folder else ""), rows, bandwidth)


def write_report(shape: str, rows: list[Row], bandwidth: float) -> None:
    stem = f"real-size-{shape}"
    record = {"machine": machine(), "read_bandwidth_gb_s": bandwidth / 1e9, "rows": [asdict(r) for r in rows]}
    (RESULTS / f"{stem}.json").write_text(json.dumps(record, indent=1))
    lines = [
        f"# Real-size GGUF files, {shape} shape: this project against llama.cpp's server, one run",
        "",
        f"Machine: {machine()}. Command: `.venv/bin/python bench/real_size.py --shape {shape} ...`. 8,192 tokens of "
        "16-bit KV each; 16 streams of 64-token prompts, 64 new tokens, greedy, EOS ignored. Read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s (bench/memory_limit.py); memory limit: one request's share of it.",
        "",
        "| file | MiB | server | ready s (1st, 2nd start) | peak RSS MiB, 16 streams | tok/s, 1 request "
        "| memory limit, 1 request | tok/s, 16 streams |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ready = ", ".join(f"{s:.1f}" for s in r.ready_s)
        share = f"{r.one_memory_limit:.0%}" if r.one_memory_limit is not None else "-"
        one, many = (f"{v:.1f}" if v is not None else "-" for v in (r.one_tokens_per_s, r.many_tokens_per_s))
        speed = [one, share, many]
        row = f"| {r.file} | {r.size_mb:.0f} | {r.server} | {ready} | {r.peak_rss_mb:.0f} | {' | '.join(speed)} |"
        lines.append(row)
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
