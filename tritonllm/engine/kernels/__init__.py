"""The native CPU kernels (C++ sources and headers beside this file: paged decode attention, dense, bfloat16 and
GGUF-block linear layers, the decoder stack, the greedy screen) and their build for this machine's CPU. Imports
nothing of the engine."""
