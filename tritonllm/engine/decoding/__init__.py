"""Logits to tokens: the sampler (greedy, temperature, top-k/p, min-p, seeds), logits processors, beam search,
grammars (llguidance) and the greedy screen of the output layer. Imports `state/`, `layers/` and `kernels/`."""
