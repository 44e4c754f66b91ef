"""Real-size GGUF files (bench/real_size_models.py) served by this project and by llama.cpp's server, one server at a
time, side by side: time to ready on a second start, the peak memory of every process of the server while it
serves 16 streams, and tokens/s for one request and for 16 streams (64-token prompts, 64 new tokens, greedy, EOS
ignored).

Both servers hold 8,192 tokens of 16-bit KV (llama.cpp `-np 16 -c 8192`, its default f16; this project 512 blocks
of 16 tokens in bfloat16), both on every core.

    .venv/bin/python bench/real_size.py --shape 1b --types Q4_K_M Q5_K_M Q8_0 IQ4_XS
    .venv/bin/python bench/real_size.py --shape 8b --types Q4_K_M --skip-speed
    .venv/bin/python bench/real_size.py --shape 1b --servers "this project" "this project, dequantized folder"

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
from peers import MODEL, STARTS, Server, fresh_prompts, llama_cpp, llama_cpp_case, ours, shim_case
from real_size_models import gguf_file
from run import RESULTS, Workload, machine

from tritonllm.formats import gguf

CONTEXT_TOKENS = 8192
STREAMS = 16
ONE = Workload(requests=1, prompt_tokens=64, new_tokens=64)
MANY = Workload(requests=STREAMS, prompt_tokens=64, new_tokens=64)
BEFORE = "this project, dequantized folder"


@dataclass
class Row:
    file: str
    size_mb: float
    server: str
    ready_s: list[float]  # every start: the first (cold caches, folder written) and the second
    peak_rss_mb: float | None = None
    one_tokens_per_s: float | None = None
    many_tokens_per_s: float | None = None


def start(name: str, file: Path) -> tuple[Server, int, bool]:
    if name == "llama.cpp":
        server, port = llama_cpp(file, CONTEXT_TOKENS, STREAMS, log=f"{log_name(name)}.log.tmp")
        return server, port, False
    flags = ("--num-kv-blocks", str(CONTEXT_TOKENS // 16), "--kv-cache-dtype", "bfloat16", "--no-embedding")
    # BEFORE: the file dequantized into a float32 folder whose layers go back into blocks, the only way before
    model = gguf.hf_model_dir(file, dequantize=True) if name == BEFORE else file
    server, port, _ = ours(RESULTS / f"{log_name(name)}.log.tmp", model=model, flags=flags)
    return server, port, True


def log_name(name: str) -> str:
    return {"llama.cpp": "llama-server-real-size", BEFORE: "tritonllm-dequantized"}.get(name, "tritonllm-real-size")


def measure(name: str, file: Path, prompts, speed: bool) -> Row:
    print(f"[real-size] {file.name}: {name}", file=sys.stderr, flush=True)
    log = log_name(name)
    STARTS.pop(log, None)
    server, _, _ = start(name, file)
    server.stop()  # the first start fills the caches (the page cache with the file, the tokenizer folder)
    server, port, ours_ = start(name, file)
    row = Row(file.name, file.stat().st_size / 2**20, name, STARTS[log])
    try:
        case = (shim_case if ours_ else llama_cpp_case)(name, port)
        case(ONE)(*next(prompts[1]))  # warm: the first request's one-time costs
        if speed:
            row.one_tokens_per_s = case(ONE)(*next(prompts[1])).tokens_per_s
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
    parser.add_argument("--servers", nargs="+", default=["llama.cpp", "this project"])
    parser.add_argument("--skip-speed", action="store_true", help="ready time and memory alone")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = {1: fresh_prompts(tokenizer, ONE), STREAMS: fresh_prompts(tokenizer, MANY)}
    rows = []
    for kind in args.types:
        file = gguf_file(args.shape, kind)
        for name in args.servers:
            rows.append(measure(name, file, prompts, not args.skip_speed))
            time.sleep(2)
    write_report(args.shape, rows)


def write_report(shape: str, rows: list[Row]) -> None:
    stem = f"real-size-{shape}"
    record = {"machine": machine(), "rows": [asdict(r) for r in rows]}
    (RESULTS / f"{stem}.json").write_text(json.dumps(record, indent=1))
    lines = [
        f"# Real-size GGUF files, {shape} shape: this project against llama.cpp's server, one run",
        "",
        f"Machine: {machine()}. Command: `.venv/bin/python bench/real_size.py --shape {shape} ...`. 8,192 tokens of "
        "16-bit KV each; 16 streams of 64-token prompts, 64 new tokens, greedy, EOS ignored.",
        "",
        "| file | MiB | server | ready s (1st, 2nd start) | peak RSS MiB, 16 streams | tok/s, 1 request "
        "| tok/s, 16 streams |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ready = ", ".join(f"{s:.1f}" for s in r.ready_s)
        speed = [f"{v:.1f}" if v is not None else "-" for v in (r.one_tokens_per_s, r.many_tokens_per_s)]
        row = f"| {r.file} | {r.size_mb:.0f} | {r.server} | {ready} | {r.peak_rss_mb:.0f} | {' | '.join(speed)} |"
        lines.append(row)
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
