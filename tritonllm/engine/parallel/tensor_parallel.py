"""Tensor parallelism: `tensor_parallel_size` processes split every decoder layer, in Megatron's layout as vLLM
and TensorRT-LLM use it.

The q, k, v, gate and up projections are column-parallel: each rank keeps the rows of its own attention heads
and its share of the MLP. The o and down projections are row-parallel: each rank multiplies its columns and an
all-reduce sums them, one per attention block and one per MLP block. Each rank's KV cache holds its own heads;
embeddings, norms and the output layer stay whole on every rank.

Rank 0 is the engine's process: it schedules, prepares each step's tensors, broadcasts them, runs its share and
samples. Ranks 1.. are processes of their own (`python -m tritonllm.engine.execution.tensor_parallel_worker`), each a
ModelRunner that only runs the steps it is sent. torch.distributed connects them: gloo on CPU, NCCL between
GPUs (the steps themselves always travel over gloo, as CPU tensors).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tritonllm.common.interpreter import python_executable
from tritonllm.common.unsupported_model import UnsupportedModelError

ATTENTION = ("q_proj", "k_proj", "v_proj")
MLP = ("gate_proj", "up_proj")
WORKER_MODULE = "tritonllm.engine.execution.tensor_parallel_worker"  # what each rank 1.. runs
TIMEOUT = timedelta(minutes=10)  # a rank still loading its model, or gone: the collectives wait this long


@dataclasses.dataclass(frozen=True)
class Place:
    rank: int
    world: int
    port: int  # rank 0's rendezvous on the loopback


class RowParallelLinear(nn.Module):
    """A linear layer whose input features are split between the ranks: partial products, summed by all-reduce.
    The bias is added once, by rank 0, into the sum."""

    def __init__(self, linear: nn.Linear, rank: int, world: int) -> None:
        super().__init__()
        columns = linear.in_features // world
        self.weight = nn.Parameter(linear.weight[:, rank * columns : (rank + 1) * columns].clone(), False)
        self.bias = None if linear.bias is None or rank else nn.Parameter(linear.bias.clone(), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        dist.all_reduce(y)
        return y


def check(model: nn.Module, world: int) -> None:
    """Refuses, naming why, a model whose layers this split does not cover exactly."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None)
    why = None
    if heads % world or kv_heads % world:
        why = f"{heads} attention heads and {kv_heads} KV heads do not split into {world} equal shares"
    elif not intermediate or intermediate % world:
        why = f"the MLP's {intermediate} features do not split into {world} equal shares"
    else:
        for i, layer in enumerate(_layers(model)):
            names = [f"self_attn.{n}" for n in (*ATTENTION, "o_proj")] + [f"mlp.{n}" for n in (*MLP, "down_proj")]
            missing = [n for n in names if not isinstance(_submodule(layer, n), nn.Linear)]
            if missing:
                why = f"layer {i} lacks the separate linear projections it splits: {missing}"
                break
    if why:
        raise UnsupportedModelError(f"tensor_parallel_size={world}: {why}")


def shard(model: nn.Module, place: Place) -> None:
    """Keeps this rank's share of every decoder layer (see check)."""
    rank, world = place.rank, place.world
    for layer in _layers(model):
        attention, mlp = layer.self_attn, layer.mlp
        for name in ATTENTION:
            linear = getattr(attention, name)
            share = linear.out_features // world
            _keep_rows(linear, rank * share, (rank + 1) * share)
        attention.o_proj = RowParallelLinear(attention.o_proj, rank, world)
        for name in MLP:
            linear = getattr(mlp, name)
            share = linear.out_features // world
            _keep_rows(linear, rank * share, (rank + 1) * share)
        mlp.down_proj = RowParallelLinear(mlp.down_proj, rank, world)


def _layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers


def _submodule(module: nn.Module, name: str) -> nn.Module | None:
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


def _keep_rows(linear: nn.Linear, start: int, stop: int) -> None:
    linear.weight = nn.Parameter(linear.weight[start:stop].clone(), False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias[start:stop].clone(), False)
    linear.out_features = stop - start


class Group:
    """The ranks of one engine, seen from any of them."""

    def __init__(self, place: Place, device: torch.device) -> None:
        self.place = place
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{place.port}",
            rank=place.rank,
            world_size=place.world,
            timeout=TIMEOUT,
        )
        self.control = dist.new_group(backend="gloo") if backend != "gloo" else None
        self.workers: list[subprocess.Popen] = []

    @classmethod
    def start(cls, world: int, device: torch.device, worker_args: list[str]) -> Group:
        """Rank 0: starts the other ranks' processes, each with its share of the cores, and joins them."""
        place = Place(0, world, _free_port())
        threads = cores_per(world)
        torch.set_num_threads(threads)
        workers = [
            subprocess.Popen(
                [python_executable(), "-m", WORKER_MODULE, f"--rank={rank}", f"--world={world}", f"--port={place.port}"]
                + [f"--threads={threads}", *worker_args]
            )
            for rank in range(1, world)
        ]
        joined: list = []
        rendezvous = threading.Thread(target=lambda: joined.append(cls(place, device)), daemon=True)
        rendezvous.start()
        while rendezvous.is_alive():  # a rank that dies while loading must not leave this waiting for TIMEOUT
            dead = [w for w in workers if w.poll() is not None]
            if dead:
                for worker in workers:
                    worker.kill()
                raise RuntimeError(f"tensor-parallel rank exited with code {dead[0].returncode} before joining")
            time.sleep(0.1)
        if not joined:
            raise RuntimeError("tensor-parallel ranks did not join")
        group = joined[0]
        group.workers = workers
        return group

    def send(self, step) -> None:
        dist.broadcast_object_list([_moved(step, torch.device("cpu"))], src=0, group=self.control)

    def receive(self, device: torch.device):
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return None if box[0] is None else _moved(box[0], device)

    def close(self) -> None:
        if self.place.rank == 0:
            self.send(None)
            for worker in self.workers:
                try:
                    worker.wait(30)
                except subprocess.TimeoutExpired:
                    worker.kill()
        dist.destroy_process_group()


def cores_per(processes: int) -> int:
    """Threads for one of `processes` that share this machine's cores: each forward pass keeps its own cores
    rather than preempting the others inside every parallel region."""
    return max(1, len(os.sched_getaffinity(0)) // processes)


def _moved(value, device: torch.device):
    """`value` with every tensor in it on `device` (steps hold tensors in dataclasses, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _moved(getattr(value, f.name), device) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
