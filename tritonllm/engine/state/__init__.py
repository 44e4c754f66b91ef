"""The state a step works on: a request's tensors read into SamplingParams (TensorRT-LLM's names), and the
Sequence each sample becomes, with its tokens, blocks, timings and thinking block. Imports only `layers/` (a
request's LoRA adapter) and the packages outside the engine."""
