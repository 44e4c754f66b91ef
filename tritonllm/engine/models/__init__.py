"""Model families: Llama-family models built from their checkpoint without transformers' model code, other GGUF
architectures read in place through transformers' modules, the shape the KV cache is sized by, and weights moved
out of the mapped file. Imports `layers/` and `kernels/`."""
