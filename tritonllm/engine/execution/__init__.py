"""One forward pass per step: the model runner (loading a folder or a GGUF file, moving weights, LoRA and native
layers in), the load check that refuses what the engine cannot run exactly (with its verdict kept between
starts), a step's packing into tensors, the native decoder stack, and a tensor-parallel rank's loop. Imports
`decoding/`, `scheduling/`, `state/`, `models/`, `parallel/`, `layers/` and `kernels/`."""
