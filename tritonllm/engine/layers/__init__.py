"""The layers a model is built from: linear layers over float32 weights and GGUF blocks (fused where
siblings share an input), attention over the paged KV cache, and per-request LoRA. Imports `kernels/` only."""
