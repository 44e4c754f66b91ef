"""This project against llama.cpp's server on the real default model, side by side in one run.

    make bench-peers                 # writes bench/results/peers.{md,json,png}
    python bench/peers.py --repeat 3

Model: SmolLM2-135M-Instruct, fp32 weights everywhere (llama.cpp gets an f32 GGUF made by its own
convert_hf_to_gguf.py from the same HF directory this project serves; its KV cache stays at its default, f16).
Workloads: W1 (32 concurrent streaming requests, 64-token prompts, 128 new tokens, EOS ignored) and C1 (one
request alone, the same shape). Servers, on loopback, each started once and kept up:
  llama.cpp   llama-server, built from the sources the llama-cpp-python sdist vendors (CMake, CPU, that target
              only), cached in ~/.cache/tritonllm-peers; 32 slots, both cores
  shim        `tritonllm serve`: OpenAI /v1/completions, streamed
  ensemble    the same server's Triton ensemble over gRPC streams
The cases take turns (round-robin, `--repeat` rounds, fresh prompts every run, none served from another's
prefix cache); each keeps its median run. vLLM's CPU build is not in the run yet (see the closing note of the
performance issue).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

import httpx
from run import (
    RESULTS,
    ROOT,
    EnsembleStreams,
    Result,
    Workload,
    from_timestamps,
    machine,
    measured,
    median_run,
    table,
)

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
CACHE = Path(os.environ.get("TRITONLLM_PEERS_CACHE", Path.home() / ".cache" / "tritonllm-peers"))
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # its sdist vendors llama.cpp's sources
WORKLOADS = {"W1": Workload(), "C1": Workload(requests=1)}


def free_port() -> int:
    from tritonllm.runtime.tritonserver import free_port as port

    return port()


def llama_cpp_sources() -> Path:
    """llama.cpp's sources as the pinned llama-cpp-python sdist vendors them, unpacked once into the cache."""
    root = CACHE / LLAMA_CPP_PYTHON.replace("==", "-")
    sources = root / "vendor" / "llama.cpp"
    if not sources.exists():
        download = CACHE / "sdist"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:", LLAMA_CPP_PYTHON]
            + ["-d", str(download)],
            check=True,
        )
        (archive,) = download.glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(CACHE, filter="data")
        (CACHE / archive.name.removesuffix(".tar.gz")).rename(root)
    return sources


def llama_server() -> Path:
    """Builds llama-server (CPU, native instructions) once."""
    sources = llama_cpp_sources()
    binary = sources / "build" / "bin" / "llama-server"
    if not binary.exists():
        flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]
        flags += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
        subprocess.run(["cmake", "-S", str(sources), "-B", str(sources / "build"), *flags], check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(sources / "build"), "--target", "llama-server", "-j", jobs], check=True)
    return binary


def f32_gguf() -> Path:
    """The served HF directory as an f32 GGUF, by llama.cpp's own converter (its vendored gguf-py first)."""
    target = CACHE / "SmolLM2-135M-Instruct-f32.gguf"
    if not target.exists():
        sources = llama_cpp_sources()
        env = {**os.environ, "PYTHONPATH": str(sources / "gguf-py")}
        script = sources / "convert_hf_to_gguf.py"
        command = [sys.executable, str(script), str(MODEL), "--outtype", "f32", "--outfile", str(target)]
        subprocess.run(command, check=True, env=env)
    return target


class Server:
    """A server process of a case, on loopback, stopped (its process group) at the end."""

    def __init__(self, command: list[str], health: str, log: Path, env: dict | None = None) -> None:
        self.log = log.open("w")
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited; see {log}")
            try:
                if httpx.get(health, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{command[0]} did not become healthy; see {log}")

    def stop(self) -> None:
        os.killpg(self.process.pid, 15)
        self.process.wait(60)
        self.log.close()


async def openai_stream(url: str, model: str, texts: list[str], w: Workload, extra: dict) -> tuple:
    """All requests at once to an OpenAI /v1/completions stream; when each was sent and each chunk arrived."""
    starts: list[float] = []
    stamps: list[list[float]] = []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=len(texts))) as client:

        async def one(text: str) -> None:
            body = {"model": model, "prompt": text, "max_tokens": w.new_tokens, "temperature": 0, "stream": True}
            mine: list[float] = []
            starts.append(time.perf_counter())
            async with client.stream("POST", url, json={**body, **extra}) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"text"' in line:
                        mine.append(time.perf_counter())
            stamps.append(mine)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(t) for t in texts))
        return starts, stamps, time.perf_counter() - t0


def openai_case(name: str, url: str, model: str, w: Workload, extra: dict):
    def run(_ids, texts: list[str]) -> Result:
        starts, stamps, wall = asyncio.run(openai_stream(url, model, texts, w, extra))
        # EOS is ignored, so every request brings max_tokens tokens, in as many chunks as the server sent
        result = from_timestamps(name, starts, stamps, wall)
        result.tokens_per_s = len(texts) * w.new_tokens / wall
        return result

    return run


def ensemble_case(grpc_url: str, w: Workload):
    streams = EnsembleStreams(grpc_url, w, "this project, Triton ensemble")

    def run(_ids, texts: list[str]) -> Result:
        return streams(texts)

    return run


def fresh_prompts(tokenizer, w: Workload):
    from run import make_prompts

    seed = 100
    while True:
        seed += 1
        yield make_prompts(tokenizer, w, seed=seed, english=True)


def ours(log: Path, repository: Path | None = None) -> tuple[Server, int, int]:
    """`tritonllm serve` on the model; the server, its shim port and its gRPC port."""
    shim_port, ports = (
        free_port(),
        {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": free_port()},
    )
    command = [
        str(Path(sys.executable).parent / "tritonllm"),
        "serve",
        "--model-dir",
        str(MODEL),
        "--host",
        "127.0.0.1",
    ]
    command += ["--shim-port", str(shim_port), *(str(v) for kv in ports.items() for v in kv)]
    if repository is not None:
        command += ["--model-repository", str(repository)]
    return Server(command, f"http://127.0.0.1:{shim_port}/health", log), shim_port, ports["--grpc-port"]


def repository_with(setting: str, into: Path) -> Path:
    """A copy of the model repository whose llm has the parameter KEY=VALUE changed."""
    key, value = setting.split("=", 1)
    target = into / "model_repository"
    shutil.copytree(ROOT / "model_repository", target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "llm" / "config.pbtxt"
    text, pattern = config.read_text(), f'{{ key: "{key}" value: {{ string_value: "'
    start = text.index(pattern) + len(pattern)
    config.write_text(text[:start] + value + text[text.index('"', start) :])
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", help="also the shim of a second server whose llm has KEY=VALUE (A/B)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    RESULTS.mkdir(parents=True, exist_ok=True)
    threads = str(os.cpu_count() or 2)
    slots = WORKLOADS["W1"].requests
    llama_port = free_port()
    servers = [
        Server(
            [str(llama_server()), "-m", str(f32_gguf()), "--host", "127.0.0.1", "--port", str(llama_port)]
            + ["-np", str(slots), "-c", str(slots * 256), "-t", threads, "-tb", threads, "--no-webui"],
            f"http://127.0.0.1:{llama_port}/health",
            RESULTS / "llama-server.log.tmp",
        )
    ]
    try:
        server, shim_port, grpc_port = ours(RESULTS / "tritonllm-serve.log.tmp")
        servers.append(server)
        variant = None
        if args.variant:
            repository = repository_with(args.variant, CACHE / "variant")
            server, variant_port, _ = ours(RESULTS / "tritonllm-variant.log.tmp", repository)
            servers.append(server)
            variant = (args.variant, variant_port)
        results = run_all(tokenizer, llama_port, shim_port, grpc_port, args.repeat, variant)
    finally:
        for server in servers:
            server.stop()
    write_report(results)


def run_all(
    tokenizer, llama_port: int, shim_port: int, grpc_port: int, repeat: int, variant: tuple[str, int] | None
) -> dict[str, list[Result]]:
    name = MODEL.name
    results: dict[str, list[Result]] = {}
    for workload, w in WORKLOADS.items():
        cases = {
            "llama.cpp": openai_case(
                "llama.cpp llama-server (f32 GGUF)",
                f"http://127.0.0.1:{llama_port}/v1/completions",
                name,
                w,
                {"ignore_eos": True, "cache_prompt": False},
            ),
            "shim": openai_case(
                "this project, shim (/v1/completions)",
                f"http://127.0.0.1:{shim_port}/v1/completions",
                name,
                w,
                {"ignore_eos": True},
            ),
            "ensemble": ensemble_case(f"127.0.0.1:{grpc_port}", w),
        }
        if variant is not None:
            setting, port = variant
            label = f"this project, shim, llm {setting}"
            url = f"http://127.0.0.1:{port}/v1/completions"
            cases["variant"] = openai_case(label, url, name, w, {"ignore_eos": True})
        prompts = fresh_prompts(tokenizer, w)
        for run in cases.values():  # warm-up, unmeasured: kernels per shape, pages of the KV cache
            run(*next(prompts))
        trials: dict[str, list[Result]] = {case: [] for case in cases}
        for round_ in range(repeat):
            for case, run in cases.items():
                print(f"[peers] {workload} round {round_ + 1}: {case}", file=sys.stderr, flush=True)
                trials[case].append(measured(run, prompts))
        results[workload] = [median_run(t) for t in trials.values()]
    return results


def write_report(results: dict[str, list[Result]]) -> None:
    versions = {"llama-cpp-python sdist (llama.cpp sources)": LLAMA_CPP_PYTHON, **machine()}
    payload = {
        "model": MODEL.name,
        "workloads": {k: asdict(w) for k, w in WORKLOADS.items()},
        "versions": versions,
        "command": " ".join(sys.argv),
        "results": {k: [asdict(r) for r in rs] for k, rs in results.items()},
    }
    (RESULTS / "peers.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        f"# {MODEL.name}, fp32: this project against llama.cpp, one run",
        "",
        f"Command: `{payload['command']}`. Versions: `{json.dumps(versions)}`.",
        "W1: 32 concurrent streaming requests, 64-token prompts, 128 new tokens, EOS ignored. C1: one request alone.",
        "ITL is the gap between streamed chunks (a chunk may carry several tokens when a server merges them).",
        "",
    ]
    for workload, rs in results.items():
        lines += [f"## {workload}", "", *table(rs, "server")]
        peer = rs[0].tokens_per_s
        lines += ["", "Ratios to llama.cpp: " + ", ".join(f"{r.case}: {r.tokens_per_s / peer:.2f}" for r in rs[1:]), ""]
    (RESULTS / "peers.md").write_text("\n".join(lines))
    plot(results, RESULTS / "peers.png")
    print((RESULTS / "peers.md").read_text())


def plot(results: dict[str, list[Result]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 * len(results), figsize=(6 * 2 * len(results), 4), squeeze=False)
    for i, (workload, rs) in enumerate(results.items()):
        labels = [textwrap.fill(r.case.replace("this project, ", ""), 22) for r in rs]
        tput, lat = axes[0][2 * i], axes[0][2 * i + 1]
        tput.bar(labels, [r.tokens_per_s for r in rs], color="#4477aa")
        tput.set_title(f"{workload}: output tokens/s")
        for j, r in enumerate(rs):
            tput.text(j, r.tokens_per_s, f"{r.tokens_per_s:.0f}", ha="center", va="bottom")
        for name, key in (("ITL p50", "itl_p50_ms"), ("ITL p99", "itl_p99_ms"), ("TTFT p50", "ttft_p50_ms")):
            lat.plot(labels, [getattr(r, key) for r in rs], marker="o", label=name)
        lat.set_yscale("log")
        lat.set_title(f"{workload}: latency, ms")
        lat.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    if shutil.which("cmake") is None:
        sys.exit("cmake is needed to build llama-server (make bench-peers installs it)")
    main()
