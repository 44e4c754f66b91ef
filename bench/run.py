"""Workload W1, side by side in one run: 32 concurrent requests, ~64-token prompts, 128 new tokens, EOS ignored.

    make bench                      # both demo models; writes bench/results/
    python bench/run.py --model small --cases d,e

Cases:
  a  transformers generate(), one request at a time
  b  transformers' own continuous batching (generate_batch)
  c  the raw decode-step ceiling: batch / time of one batched decode forward (DynamicCache, sdpa)
  d  this engine, in-process
  e  this engine through Triton's ensemble, with concurrent gRPC streams
  e2 the same, each request asking for a response every 2 tokens (stream_interval 2) instead of every token
Each case reports output tokens/s, TTFT p50/p99, inter-token latency p50/p99 (ms) and the CPU steal during the
run. Every case first runs the workload once unmeasured (warm-up: oneDNN builds its kernels per shape, the KV
cache pages in), and d's engine and e's server then stay up for the measured runs, as a serving process would.
Every run, warm-up included, gets prompts of its own, so none is served from another's prefix cache. The cases
take turns (round-robin, `--repeat` rounds) and each keeps its median run. A run during which the VM's host took
more than 10% of the CPU (steal) is done again with new prompts, at most twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


CASES = ("a", "b", "c", "d", "e", "e2")
MAX_STEAL_PCT = 10.0
RERUNS = 2


@dataclass
class Workload:
    requests: int = 32
    prompt_tokens: int = 64
    new_tokens: int = 128


@dataclass
class Result:
    case: str
    tokens_per_s: float
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    note: str = ""
    steal_pct: float | None = None  # CPU time the VM's host took during the run


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values) * 1e3, q)) if values else float("nan")


def from_timestamps(case: str, starts: list[float], stamps: list[list[float]], wall: float, note: str = "") -> Result:
    """starts[i]: when request i was sent; stamps[i]: when each of its tokens arrived."""
    ttft = [s[0] - t0 for t0, s in zip(starts, stamps, strict=True)]
    itl = [b - a for s in stamps for a, b in zip(s, s[1:], strict=False)]
    tokens = sum(len(s) for s in stamps)
    return Result(
        case,
        tokens / wall,
        percentile(ttft, 50),
        percentile(ttft, 99),
        percentile(itl, 50),
        percentile(itl, 99),
        note,
    )


def make_prompts(tokenizer, w: Workload, seed: int = 7, english: bool = False) -> tuple[list[list[int]], list[str]]:
    """Prompt texts that tokenize to exactly `prompt_tokens` ids; the same seed gives every case the same prompts.
    A group of corpus lines whose prefixes skip that length (a cut inside a multi-byte character re-encodes
    longer) gives way to the next group. `english`: English words only (the demo corpus mixes in CJK and emoji,
    on which a real model, its end token ignored, tends to write invalid bytes)."""
    import random

    from tritonllm.formats.demo_model import ENGLISH_WORDS, synthetic_corpus

    count = w.requests * 8 * 4
    if english:
        rng = random.Random(seed)
        lines = [" ".join(rng.choice(ENGLISH_WORDS) for _ in range(rng.randint(4, 16))) + "." for _ in range(count)]
    else:
        lines = synthetic_corpus(seed=seed, lines=count)
    ids, texts = [], []
    for group in range(w.requests * 4):
        tokens = tokenizer.encode(" ".join(lines[group * 8 : (group + 1) * 8]), add_special_tokens=False)
        for cut in range(w.prompt_tokens, len(tokens)):
            text = tokenizer.decode(tokens[:cut])
            again = tokenizer.encode(text, add_special_tokens=False)
            if len(again) == w.prompt_tokens:
                ids.append(again)
                texts.append(text)
                break
        if len(ids) == w.requests:
            return ids, texts
    raise RuntimeError("could not build enough prompts of the wanted length")


class Stamper:
    """A generate() streamer that notes when each new token arrives."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.prompt_seen = False

    def put(self, value) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True  # generate() first hands over the prompt
            return
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def case_a(model, prompts, w: Workload, sample: int) -> Result:
    starts, stamps = [], []
    wall = 0.0
    for prompt in prompts[:sample]:
        stamper = Stamper()
        t0 = time.perf_counter()
        model.generate(
            torch.tensor([prompt]),
            max_new_tokens=w.new_tokens,
            min_new_tokens=w.new_tokens,
            do_sample=False,
            pad_token_id=0,
            streamer=stamper,
        )
        wall += time.perf_counter() - t0
        starts.append(t0)
        stamps.append(stamper.stamps)
    result = from_timestamps("a: generate(), one at a time", starts, stamps, wall)
    result.note = f"{sample} of {w.requests} requests, run back to back"
    return result


def case_b(model, prompts, w: Workload) -> Result:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    config = GenerationConfig(
        max_new_tokens=w.new_tokens, min_new_tokens=w.new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    cb = ContinuousBatchingConfig(num_blocks=64, page_size=256, max_batch_tokens=512)
    t0 = time.perf_counter()
    outputs = model.generate_batch(
        prompts, generation_config=config, continuous_batching_config=cb, record_timestamps=True
    )
    wall = time.perf_counter() - t0
    done = list(outputs.values())
    stamps = [list(o.timestamps or []) for o in done]
    return from_timestamps("b: transformers generate_batch", [o.created_time for o in done], stamps, wall)


def case_c(model, prompts, w: Workload) -> Result:
    from transformers import DynamicCache

    batch = torch.tensor(prompts)
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(batch, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        # Grow the cache to the workload's mean context (prompt + half the output) before timing.
        for _ in range(w.new_tokens // 2):
            out = model(token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(16):
            t0 = time.perf_counter()
            out = model(token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - t0)
            cache.crop(-1)  # keep the context where it is
    step = statistics.median(times)
    return Result(
        "c: decode-step ceiling", len(prompts) / step, note=f"median batched decode forward {step * 1e3:.1f} ms"
    )


class InProcessEngine:
    """Case d: one engine for every run, driven step by step from this thread."""

    def __init__(self, model_dir: Path, w: Workload, gguf_file: Path | None = None) -> None:
        """`gguf_file`: `model_dir` is its dequantized directory, and its Q8_0/Q4 weights stay quantized."""
        from tritonllm.engine.engine import EngineConfig, LLMEngine

        config = EngineConfig(
            str(model_dir), num_kv_blocks=1024, max_num_seqs=64, gguf_file=str(gguf_file) if gguf_file else None
        )
        self.engine = LLMEngine(config)
        self.w = w

    def __call__(self, prompts: list[list[int]]) -> Result:
        from tritonllm.engine.state.sampling_params import SamplingParams
        from tritonllm.engine.state.sequence import Sequence

        seqs = [Sequence(p, SamplingParams(max_tokens=self.w.new_tokens)) for p in prompts]
        stamps: dict[int, list[float]] = {s.seq_id: [] for s in seqs}
        t0 = time.perf_counter()
        for seq in seqs:
            self.engine.add(seq)
        while self.engine.has_work():
            outputs = self.engine.step()
            now = time.perf_counter()
            for out in outputs:
                stamps[out.seq.seq_id] += [now] * len(out.new_token_ids)
        wall = time.perf_counter() - t0
        return from_timestamps("d: this engine, in-process", [t0] * len(seqs), list(stamps.values()), wall)


class EnsembleStreams:
    """Streams all requests of a run at once to a Triton ensemble over gRPC; each token's arrival is noted."""

    def __init__(self, grpc_url: str, w: Workload, label: str = "e: Triton ensemble") -> None:
        self.grpc_url = grpc_url
        self.w = w
        self.label = label

    def __call__(self, texts: list[str], stream_interval: int = 1) -> Result:
        return asyncio.run(self._run(texts, stream_interval))

    async def _run(self, texts: list[str], stream_interval: int) -> Result:
        import tritonclient.grpc.aio as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc_url)
        starts: list[float] = []
        stamps: list[list[float]] = []
        t0 = time.perf_counter()
        await asyncio.gather(*(self._one(client, t, stream_interval, starts, stamps) for t in texts))
        wall = time.perf_counter() - t0
        await client.close()
        case = f"{self.label}, {len(texts)} gRPC streams"
        if stream_interval != 1:
            case = f"e{stream_interval}: {case[3:]}, stream_interval {stream_interval}"
        return from_timestamps(case, starts, stamps, wall)

    async def _one(self, client, text: str, stream_interval: int, starts: list, stamps: list) -> None:
        from tritonllm.shim.triton_requests import infer_input
        from tritonllm.wire.triton_names import REPOSITORY_NAMES

        inputs = [
            infer_input("text_input", "BYTES", np.array([[text.encode()]], dtype=np.object_)),
            infer_input("max_tokens", "INT32", np.array([[self.w.new_tokens]], dtype=np.int32)),
            infer_input("end_id", "INT32", np.array([[-1]], dtype=np.int32)),  # EOS ignored
            infer_input("stream", "BOOL", np.array([[True]])),
            infer_input("stream_interval", "INT32", np.array([[stream_interval]], dtype=np.int32)),
        ]

        async def requests():
            yield {"model_name": REPOSITORY_NAMES.ensemble, "inputs": inputs}

        mine: list[float] = []
        starts.append(time.perf_counter())
        # Read to the stream's end, not left at the final response: tritonserver 2.51 may crash when a call is
        # cancelled (see tritonllm/shim/triton_client.py), which grpc.aio does to a call collected unfinished.
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise RuntimeError(error)
            # a response carries several tokens with stream_interval > 1, or when the server merged a backlog
            mine += [time.perf_counter()] * result.as_numpy("output_ids").size
        if len(mine) != self.w.new_tokens:
            raise RuntimeError(f"a stream brought {len(mine)} tokens, not {self.w.new_tokens}")
        stamps.append(mine)


class TritonEnsemble(EnsembleStreams, contextlib.AbstractContextManager):
    """Cases e and e2: one tritonserver for every run; each run streams all requests at once over gRPC."""

    def __init__(self, model_dir: Path, w: Workload) -> None:
        from tritonllm.backend.model_parameters import MODEL_DIR_ENV
        from tritonllm.launcher.tritonserver import TritonServer, free_port

        self.server = TritonServer(
            ROOT / "model_repository",
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            env={MODEL_DIR_ENV: str(model_dir)},
            log_file=RESULTS / "tritonserver.log.tmp",
        )
        self.server.start()
        super().__init__(self.server.grpc_url, w)

    def __exit__(self, *exc) -> None:
        self.server.stop()


def under_the_servers_allocator() -> None:
    """Runs this script again with the allocator `serve` preloads into tritonserver and the llm
    (tritonllm/launcher/allocator.py), unless it runs with it already: an in-process engine is then measured as
    the server runs it (tcmalloc spares its steps page faults that glibc's malloc takes)."""
    from tritonllm.launcher.allocator import with_allocator

    env = with_allocator(dict(os.environ))
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def machine() -> dict:
    """What a figure was measured on: the CPU by name and the vector instruction sets it offers, since the same
    code runs at different ratios on Intel with AVX-512 and on AMD with AVX2 only."""
    from importlib.metadata import PackageNotFoundError, version

    from tritonllm.engine.kernels import cpu_kernels

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:  # a GPU machine that runs only the engine (decode_step.py)
            return "absent"

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")]
    flags = set(info.split())
    return {
        "cpu": names[0] if names else platform.processor() or platform.machine(),
        "isa": " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags),
        # peers.py --isa avx2: the servers ran as on an AVX2-only CPU, whatever the CPU has
        **({"capped_to": cap} if (cap := cpu_kernels.isa()) != "native" else {}),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "tritonclient": installed("tritonclient"),
        "tritonserver": "2.51.0 (nvidia-pytriton 0.7.0)",
        "threads": torch.get_num_threads(),
        "preloaded": os.environ.get("LD_PRELOAD", ""),
    } | ({"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {})


def bench_model(name: str, cases: str, w: Workload, sample_a: int, repeat: int) -> list[Result]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = ROOT / "models" / name
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # every run, warm-ups and redone runs included, takes the next set
    fresh_prompts = (make_prompts(tokenizer, w, seed=7 + i) for i in itertools.count())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    keys = cases.split(",")
    with contextlib.ExitStack() as stack:
        runs = {
            "a": lambda ids, texts: case_a(model, ids, w, sample_a),
            "b": lambda ids, texts: case_b(model, ids, w),
            "c": lambda ids, texts: case_c(model, ids, w),
        }
        if "d" in keys:
            engine = InProcessEngine(model_dir, w)
            runs["d"] = lambda ids, texts: engine(ids)
        if {"e", "e2"} & set(keys):
            server = stack.enter_context(TritonEnsemble(model_dir, w))
            runs["e"] = lambda ids, texts: server(texts)
            runs["e2"] = lambda ids, texts: server(texts, stream_interval=2)
        for key in keys:
            print(f"[bench] {name}: case {key}, warm-up ...", file=sys.stderr, flush=True)
            runs[key](*next(fresh_prompts))
        # Round-robin over the cases, so a slow spell of the machine falls on all of them rather than on one.
        trials: dict[str, list[Result]] = {key: [] for key in keys}
        for trial in range(1, repeat + 1):
            for key in keys:
                print(f"[bench] {name}: case {key}, run {trial}/{repeat} ...", file=sys.stderr, flush=True)
                result = measured(runs[key], fresh_prompts)
                trials[key].append(result)
                print(f"[bench]   {json.dumps(asdict(result))}", file=sys.stderr, flush=True)
    return [median_run(t) for t in trials.values()]


def measured(run, fresh_prompts: Iterator[tuple[list[list[int]], list[str]]]) -> Result:
    """One run of a case; a run during which the VM's host took more than MAX_STEAL_PCT of the CPU is run again
    (up to RERUNS times, each with new prompts) and noted, since steal slows the cases unevenly."""
    redone = 0
    while True:
        before = cpu_ticks()
        result = run(*next(fresh_prompts))
        result.steal_pct = steal_percent(before, cpu_ticks())
        if result.steal_pct <= MAX_STEAL_PCT or redone == RERUNS:
            break
        redone += 1
        print(f"[bench]   {result.steal_pct:.0f}% steal, run again", file=sys.stderr, flush=True)
    if redone:
        result.note = f"{result.note}; {redone} run(s) over {MAX_STEAL_PCT:.0f}% steal redone".lstrip("; ")
    return result


def cpu_ticks() -> list[int]:
    """The machine's CPU time so far by kind (/proc/stat's first line: user, nice, system, idle, ..., steal)."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def steal_percent(before: list[int], after: list[int]) -> float:
    """The share of CPU time the VM's host took for others: high steal slows every case, unevenly."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return 100.0 * spent[7] / max(sum(spent), 1)


def median_run(trials: list[Result]) -> Result:
    """The run with the median throughput, noting the spread: this machine is noisy."""
    ordered = sorted(trials, key=lambda r: r.tokens_per_s)
    chosen = ordered[(len(ordered) - 1) // 2]
    spread = f"median of {len(trials)} runs ({ordered[0].tokens_per_s:.0f}..{ordered[-1].tokens_per_s:.0f} tok/s)"
    chosen.note = f"{chosen.note}; {spread}" if chosen.note else spread
    return chosen


def write_report(all_results: dict[str, list[Result]], w: Workload, name: str) -> Path:
    """Writes `name`.json / .md / .png under bench/results; returns the markdown file."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "workload": asdict(w),
        "machine": machine(),
        "command": " ".join(sys.argv),
        "results": {m: [asdict(r) for r in rs] for m, rs in all_results.items()},
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# W1: 32 concurrent requests, 64-token prompts, 128 new tokens, EOS ignored, fp32",
        "",
        f"Command: `{payload['command']}`. Machine: `{json.dumps(payload['machine'])}`.",
        "",
    ]
    for model, results in all_results.items():
        by_case = {r.case.split(":")[0]: r for r in results}
        lines += [f"## {model}", "", *table(results, "case")]
        ratios = [
            f"{x}/{y} = {by_case[x].tokens_per_s / by_case[y].tokens_per_s:.2f}"
            for x, y in (("e", "b"), ("e", "c"), ("e2", "b"), ("e2", "c"), ("d", "c"), ("e", "a"))
            if x in by_case and y in by_case
        ]
        lines += ["", "Ratios of tokens/s: " + ", ".join(ratios), ""]
    (RESULTS / f"{name}.md").write_text("\n".join(lines))
    plot(all_results, RESULTS / f"{name}.png")
    return RESULTS / f"{name}.md"


def table(results: list[Result], first: str) -> list[str]:
    """The markdown table of results, one row each; `first` heads the column that names them."""
    lines = [
        f"| {first} | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | CPU steal % | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = [r.ttft_p50_ms, r.ttft_p99_ms, r.itl_p50_ms, r.itl_p99_ms, r.steal_pct]
        shown = " | ".join("-" if v is None else f"{v:.1f}" for v in cells)
        lines.append(f"| {r.case} | {r.tokens_per_s:.1f} | {shown} | {r.note} |")
    return lines


def plot(all_results: dict[str, list[Result]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_results), figsize=(6 * len(all_results), 4), squeeze=False)
    for ax, (model, results) in zip(axes[0], all_results.items(), strict=True):
        ax.bar([r.case.split(":")[0] for r in results], [r.tokens_per_s for r in results], color="#4477aa")
        ax.set_title(f"W1 on '{model}': output tokens/s")
        ax.set_ylabel("tokens/s")
        for i, r in enumerate(results):
            ax.text(i, r.tokens_per_s, f"{r.tokens_per_s:.0f}", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    under_the_servers_allocator()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", choices=["tiny", "small"])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--sample-a", type=int, default=4, help="requests case a runs one after another")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case; the median is reported")
    args = parser.parse_args()
    w = Workload()
    models = args.model or ["small", "tiny"]
    results = {name: bench_model(name, args.cases, w, args.sample_a, args.repeat) for name in models}
    # Only a full run replaces the recorded results; a partial one goes beside them (not tracked).
    full = set(models) == {"small", "tiny"} and set(args.cases.split(",")) == set(CASES)
    print(write_report(results, w, "W1" if full else "partial").read_text())


if __name__ == "__main__":
    main()
