"""kv_cache_dtype on the real default model, served through `tritonllm serve` with the float32, the bfloat16 and
the int8 KV cache: the memory a token takes, greedy agreement with transformers' own generate() (20 prompts x 64
tokens), the log-likelihood drift on lm-eval's multiple-choice task of the suite (each choice's log-likelihood
against lm-eval's own transformers model), and W1 through the shim (32 streams; each server alone while measured).

    .venv/bin/python bench/kv_cache_dtype.py     # writes bench/results/kv_cache_dtype.md
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from peers import MODEL, WORKLOADS, fresh_prompts, greedy_agreement, greedy_reference, ours, shim_case
from run import RESULTS, ROOT, machine, measured, median_run
from transformers import AutoConfig, AutoTokenizer

from tritonllm.engine.layers.paged_attention import KVCache

TASK = "tritonllm_facts_mc"
TASKS = ROOT / "tests" / "clients" / "lm_eval_tasks"
LM_EVAL = ROOT / ".venv-clients" / "bin" / "lm-eval"
DTYPES = {"float32": 4, "bfloat16": 2, "int8": 1}  # int8: and a float32 scale per head vector (KVCache)
TRIALS = 3


def lm_eval(model: str, model_args: str, *extra: str) -> dict[int, list[float]]:
    """Each document's choices' log-likelihoods from lm-eval's multiple-choice task."""
    with tempfile.TemporaryDirectory() as out:
        args = [str(LM_EVAL), "run", "--model", model, "--model_args", model_args, "--tasks", TASK]
        args += ["--include_path", str(TASKS), "--output_path", out, "--log_samples", *extra]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        subprocess.run(args, cwd=TASKS, env=env, check=True, capture_output=True, timeout=1200)
        (samples,) = Path(out).glob(f"*/samples_{TASK}_*.jsonl")
        docs = map(json.loads, samples.read_text().splitlines())
        return {d["doc_id"]: ([float(r[0][0]) for r in d["resps"]], d["acc"]) for d in docs}


def drift(served: dict, reference: dict) -> dict:
    gaps = [abs(a - b) for i, (lls, _) in served.items() for a, b in zip(lls, reference[i][0], strict=True)]
    return {
        "max_abs": max(gaps),
        "mean_abs": statistics.fmean(gaps),
        "accuracy": statistics.fmean(acc for _, acc in served.values()),
        "choices": len(gaps),
    }


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    config = AutoConfig.from_pretrained(MODEL)
    head_dim = config.hidden_size // config.num_attention_heads
    per_token = {
        dtype: KVCache.block_bytes(config.num_hidden_layers, 1, config.num_key_value_heads, head_dim, size)
        for dtype, size in DTYPES.items()
    }
    texts, expected = greedy_reference(tokenizer, MODEL, count=20, new_tokens=64)
    reference = lm_eval("hf", f"pretrained={MODEL},dtype=float32", "--device", "cpu")
    servers, ports, results = {}, {}, {}
    try:
        for dtype in DTYPES:
            log = RESULTS / f"tritonllm-kv-{dtype}.log.tmp"
            servers[dtype], ports[dtype], _ = ours(log, flags=("--kv-cache-dtype", dtype, "--no-embedding"))
            servers[dtype].pause()
        for dtype, port in ports.items():
            servers[dtype].resume()
            args = f"model={MODEL.name},base_url=http://127.0.0.1:{port}/v1/completions,num_concurrent=4"
            results[dtype] = {
                "agreement": greedy_agreement(port, tokenizer, texts, expected),
                "drift": drift(lm_eval("local-completions", f"{args},tokenized_requests=False"), reference),
            }
            servers[dtype].pause()
        w = WORKLOADS["W1"]
        prompts = fresh_prompts(tokenizer, w)  # new prompts every run: none finds its prefix cached
        trials = {dtype: [] for dtype in DTYPES}
        for _ in range(TRIALS):  # alternating, each server alone
            for dtype, port in ports.items():
                servers[dtype].resume()
                trials[dtype].append(measured(shim_case(dtype, port)(w), prompts))
                servers[dtype].pause()
        for dtype in DTYPES:
            results[dtype]["w1"] = median_run(trials[dtype])
    finally:
        for server in servers.values():
            server.stop()
    write_report(per_token, results, drift({i: (lls, acc) for i, (lls, acc) in reference.items()}, reference))


def write_report(per_token: dict, results: dict, reference: dict) -> None:
    lines = [
        "# kv_cache_dtype: the float32 KV cache against bfloat16 and int8, SmolLM2-135M-Instruct, fp32 weights",
        "",
        f"Command: `.venv/bin/python bench/kv_cache_dtype.py`. Machine: `{json.dumps(machine())}`.",
        "Greedy agreement: 20 prompts x 64 tokens through the shim's /v1/completions, against transformers' own",
        "generate() on the float32 model (identical answers, and the mean share of the expected text matched before",
        "the first difference). Drift: each choice's log-likelihood from lm-eval's local-completions on the suite's",
        f"multiple-choice task ({TASK}), against lm-eval's own `hf` model on the same weights. W1: 32 streams of",
        "64-token prompts and 128 new tokens through the shim, median of 3 runs, each server alone while measured.",
        "",
        "| KV cache | bytes a token | tokens in 1 GiB | greedy identical | leading text matched | max abs drift |"
        " mean abs drift | accuracy (hf: {:.3f}) | W1 tok/s |".format(reference["accuracy"]),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dtype, r in results.items():
        a, d = r["agreement"], r["drift"]
        lines.append(
            f"| {dtype} | {per_token[dtype]:,} | {(1 << 30) // per_token[dtype]:,} | {a['identical']}/{a['prompts']} |"
            f" {a['matching_leading_text']:.3f} | {d['max_abs']:.2e} | {d['mean_abs']:.2e} | {d['accuracy']:.3f} |"
            f" {r['w1'].tokens_per_s:.1f} |"
        )
    (RESULTS / "kv_cache_dtype.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
