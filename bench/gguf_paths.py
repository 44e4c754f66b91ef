"""A GGUF file's two ways into the engine, in-process, side by side on one machine: dequantized into an HF folder
whose layers are swapped back into the engine's block layouts (formats/gguf.convert, engine/models/gguf_swap.py: the
only way before the file was read in place), and read in place in its own blocks (formats/gguf_weights.py,
engine/layers/gguf_linear.py). For one sequence and for 16 decoding together: the median decode step and output tokens/s
(64-token prompts, 64 new tokens: decode_step.py's step_times), the load's time and the process's peak RSS after it.

    .venv/bin/python bench/gguf_paths.py FILE.gguf [--paths swap file]
"""

from __future__ import annotations

import argparse
import gc
import resource
import subprocess
import sys
import time
from pathlib import Path

PROMPT_TOKENS = 64  # and decode_step.NEW_TOKENS new tokens


def run(path: str, file: Path, batches: list[int]) -> dict:
    from decode_step import step_times

    from tritonllm.engine.engine import EngineConfig, LLMEngine
    from tritonllm.formats import gguf

    folder = gguf.hf_model_dir(file, dequantize=path == "swap")
    started = time.perf_counter()
    config = EngineConfig(str(folder), num_kv_blocks=256, gguf_file=str(file) if path == "swap" else None)
    engine = LLMEngine(config)
    result = {"path": path, "load_s": time.perf_counter() - started}
    gc.collect()
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    vocab = engine.runner.shape.vocab_size
    for batch in batches:
        best = None
        for round_ in range(2):
            prompts = [
                [(7 * i + 13 * j + 101 * round_) % (vocab - 1000) + 500 for j in range(PROMPT_TOKENS)]
                for i in range(batch)
            ]
            figures = step_times(engine, prompts)
            best = figures if best is None or figures[1] > best[1] else best
        result[f"{batch}"] = {"step_ms": round(best[0], 1), "tokens_per_s": round(best[1], 1)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path)
    parser.add_argument("--paths", nargs="+", default=["swap", "file"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one path alone
    args = parser.parse_args()
    if args.one:
        print(run(args.one, args.file, args.batches), flush=True)
        return
    for path in args.paths:  # each in a process of its own, so that its peak RSS is its own
        command = [sys.executable, __file__, str(args.file), "--one", path, "--batches", *map(str, args.batches)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        print(done.stdout.strip().splitlines()[-1] if done.returncode == 0 else done.stderr[-3000:], flush=True)


if __name__ == "__main__":
    main()
