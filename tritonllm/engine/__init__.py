"""The engine: in-flight batching over a paged KV cache, run inside the llm model's Python stub. Its rooms, each
importing only the rooms below it (`make lint` holds the order):

- `engine.py`, `engine_thread.py`: the step loop (schedule, run, sample, finish) and the thread the llm model
  submits to; `config.py`: the llm's settings; `stats.py`: what the loop counts for metrics.
- `speculation/`: draft tokens, from the sequence's own text or a smaller model, for a step to verify.
- `execution/`: the model runner (loading, the load check, packing a step, one forward pass), on one process or
  tensor-parallel ranks.
- `decoding/` and `scheduling/`: logits to tokens (sampling, beams, processors, grammars, the greedy screen);
  which sequences run in a step and the KV blocks they hold.
- `state/`: what a request asks (its tensors read into SamplingParams) and what a sequence holds as it runs.
- `models/` and `parallel/`: model families built from their checkpoints or GGUF files, and their shapes; the
  tensor-parallel process group and its sharding.
- `layers/`: linear layers (float32, bfloat16, GGUF blocks, fused), paged attention, LoRA.
- `kernels/`: the native C++ kernels and their build.
"""
