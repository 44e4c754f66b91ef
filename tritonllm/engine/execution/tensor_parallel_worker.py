"""One rank 1.. of a tensor-parallel engine: a process of its own, started by rank 0 (tensor_parallel.Group.start),
that builds its share of the model and runs the steps rank 0 sends until rank 0 ends the group."""

from __future__ import annotations

import argparse

import torch

from tritonllm.engine.execution.model_runner import ModelRunner
from tritonllm.engine.parallel.tensor_parallel import Place
from tritonllm.engine.scheduling.block_manager import BlockManager


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one rank of a tensor-parallel engine (started by rank 0)")
    for name in ("rank", "world", "port", "threads", "num-blocks", "block-size"):
        parser.add_argument(f"--{name}", type=int, required=True)
    for name in ("model-dir", "dtype", "kv-cache-dtype", "device"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    blocks = BlockManager(args.num_blocks, args.block_size, prefix_caching=False)
    place = Place(args.rank, args.world, args.port)
    device = args.device if args.device != "cuda" else f"cuda:{args.rank}"
    runner = ModelRunner(args.model_dir, blocks, args.dtype, device, place=place, kv_cache_dtype=args.kv_cache_dtype)
    runner.follow()


if __name__ == "__main__":
    main()
