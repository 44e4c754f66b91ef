"""C1 with and without n-gram speculation, side by side with llama.cpp's own, on the default model's Q4_1 file.

    python bench/speculation.py            # writes bench/results/speculation.{md,json}

One request alone, greedy, chat: code edits that repeat much of their prompt (the workload prompt lookup is
for) and a free answer (where drafts mostly miss, so speculation must not cost). Servers: llama-server plain and
with `--spec-type ngram-simple`; `tritonllm serve` plain and with `--speculative ngram`, and the plain one with the
code as the request's `prediction` (OpenAI's Predicted Outputs; code workloads only). Each case runs alone
(the other servers stopped), in turns, `--repeat` rounds; tokens/s is completion tokens over the request's wall
time (time to first token included), medians. The answers of each server with and without speculation are
compared: greedy output must not change.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import httpx
from peers import MODEL, Q4_1_GGUF, RESULTS, Server, llama_cpp, ours
from run import machine

CODE = """import json
from pathlib import Path


def load_users(path):
    with open(path) as f:
        return json.load(f)


def save_users(path, users):
    with open(path, "w") as f:
        json.dump(users, f, indent=2)


def find_user(users, name):
    for user in users:
        if user["name"] == name:
            return user
    return None


def add_user(users, name, email):
    users.append({"name": name, "email": email})
    return users
"""
# name: (the request, the text the answer is expected to repeat: what a Predicted Outputs client sends)
WORKLOADS = {
    "rename a function in code": (
        f"Rename the function find_user to get_user in this code. Show the whole code.\n\n{CODE}",
        CODE,
    ),
    "add type hints to code": (f"Add type hints to every function in this code. Show the whole code.\n\n{CODE}", CODE),
    "free answer": ("Write a short story about a lighthouse keeper who finds a message in a bottle.", None),
}
PREDICTED = "this project, prediction: the code"
NEW_TOKENS = 128


def ask(port: int, content: str, prediction: str | None = None) -> tuple[float, str]:
    """Tokens per second of one greedy chat request, and its answer."""
    body = {
        "model": MODEL.name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }
    if prediction:
        body["prediction"] = {"type": "content", "content": prediction}
    started = time.perf_counter()
    response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    wall = time.perf_counter() - started
    answer = response.json()
    return answer["usage"]["completion_tokens"] / wall, answer["choices"][0]["message"]["content"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, dict[str, list[float]]] = {}
    answers: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for label, (server, port) in {
            "llama.cpp": llama_cpp(Q4_1_GGUF, context=4096, slots=1),
            "llama.cpp, --spec-type ngram-simple": llama_cpp(
                Q4_1_GGUF, context=4096, slots=1, extra=("--spec-type", "ngram-simple"), log="llama-spec.log.tmp"
            ),
        }.items():
            stack.callback(server.stop)
            servers[label] = (server, port)
        for label, flags in {
            "this project": (),
            "this project, --speculative ngram": ("--speculative", "ngram"),
        }.items():
            server, port, _ = ours(RESULTS / f"tritonllm-{len(servers)}.log.tmp", model=Q4_1_GGUF, flags=flags)
            stack.callback(server.stop)
            servers[label] = (server, port)
        servers[PREDICTED] = servers["this project"]  # the plain server, the code sent as the prediction

        def alone(chosen: Server | None) -> None:
            for server, _ in servers.values():
                server.resume() if server is chosen else server.pause()

        for server, port in servers.values():  # warm-up
            alone(server)
            ask(port, "Hello")
        for round_ in range(args.repeat):
            for workload, (content, prediction) in WORKLOADS.items():
                for label, (server, port) in servers.items():
                    if label == PREDICTED and prediction is None:
                        continue
                    print(f"[speculation] round {round_ + 1}: {workload}: {label}", file=sys.stderr, flush=True)
                    alone(server)
                    rate, answer = ask(port, content, prediction if label == PREDICTED else None)
                    rates.setdefault(workload, {}).setdefault(label, []).append(rate)
                    answers.setdefault(workload, {})[label] = answer
        alone(None)
        for server, _ in servers.values():
            server.resume()
    write_report(rates, answers, args)


def write_report(rates: dict, answers: dict, args: argparse.Namespace) -> None:
    labels = list(next(iter(rates.values())))
    lines = [
        "# C1 with n-gram speculation: SmolLM2-135M-Instruct, Q4_1 GGUF",
        "",
        f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`. Machine: `{json.dumps(machine())}`.",
        f"One greedy chat request alone, {NEW_TOKENS} tokens (EOS ignored); tokens/s over the request's wall time, "
        f"median of {args.repeat}; in brackets the ratio to the same server without speculation.",
        "",
        "| workload | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for workload, by_label in rates.items():
        medians = {label: statistics.median(values) for label, values in by_label.items()}
        cells = []
        for label in labels:
            if label not in medians:
                cells.append("-")
                continue
            base = medians[label.split(",")[0]]
            cells.append(
                f"{medians[label]:.1f}" + ("" if label == label.split(",")[0] else f" ({medians[label] / base:.2f})")
            )
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    lines += ["", "Greedy answers unchanged by speculation (against the same server without it, same request):", ""]
    for workload, by_label in answers.items():
        pairs = (("llama.cpp", "--spec-type ngram-simple"), ("this project", "--speculative ngram"))
        same = {f"{base}, {flag}": by_label[base] == by_label[f"{base}, {flag}"] for base, flag in pairs}
        if PREDICTED in by_label:
            same[PREDICTED] = by_label["this project"] == by_label[PREDICTED]
        lines.append(f"- {workload}: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in same.items()))
    (RESULTS / "speculation.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "speculation.json").write_text(json.dumps({"rates": rates, "answers": answers}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
