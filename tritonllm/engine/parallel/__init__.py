"""Tensor parallelism: the process group of `tensor_parallel_size` ranks and Megatron's sharding of each decoder
layer. Imports nothing of the engine."""
