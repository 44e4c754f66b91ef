"""A/B of two settings of the engine, alternating step by step in one process: on a shared VM whose speed drifts
by a quarter from one minute to the next, two runs taken minutes apart cannot tell a 3% change; adjacent decode
steps can. The variant is an environment variable that the code under test reads at each step (a C++ kernel
reads it with getenv at each call, say) while it is being measured; the switch goes before the change is kept.

Every decode step of W1 (32 sequences, 64-token prompts, 128 new tokens) runs with NAME set to the next of the
values in turn; the report gives each value's median step time and, for two values, the median ratio of each
step to the step before it taken with the other value (values alternate, so drift cancels out).

    .venv/bin/python bench/step_ab.py PF_MODE 0,1 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from peers import MODEL, WORKLOADS
from run import InProcessEngine, make_prompts, under_the_servers_allocator

from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence


def main() -> None:
    under_the_servers_allocator()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the environment variable the code under test reads")
    parser.add_argument("values", help="comma-separated values, taken in turn step by step")
    parser.add_argument("--runs", type=int, default=3, help="W1 runs, each with fresh prompts")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    values = args.values.split(",")
    w = WORKLOADS["W1"]
    engine = InProcessEngine(MODEL, w).engine
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    times: dict[str, list[float]] = {v: [] for v in values}
    ratios = []  # a step's time over the step before it, with the second value over the first
    for run in range(args.runs):
        sequences = [
            Sequence(p, SamplingParams(max_tokens=w.new_tokens)) for p in make_prompts(tokenizer, w, 11 + run)[0]
        ]
        for sequence in sequences:
            engine.add(sequence)
        step, previous = 0, None
        while engine.has_work():
            value = values[step % len(values)]
            os.environ[args.name] = value
            decoding = all(s.num_output_tokens >= 1 for s in sequences)
            began = time.perf_counter()
            outputs = engine.step()
            took = time.perf_counter() - began
            step += 1
            if not decoding or len(outputs) != len(sequences):  # a prompt step, or the last one
                previous = None
                continue
            times[value].append(took)
            if previous is not None and previous[0] != value and len(values) == 2:
                ratio = took / previous[1]
                ratios.append(ratio if value == values[1] else 1 / ratio)
            previous = (value, took)
    for value in values:
        print(
            f"{args.name}={value}: median decode step {statistics.median(times[value]) * 1e3:.2f} ms "
            f"({len(times[value])} steps)"
        )
    if ratios:
        print(f"{values[1]} / {values[0]}: median step ratio {statistics.median(ratios):.3f} ({len(ratios)} pairs)")


if __name__ == "__main__":
    main()
