"""`serve --decoupled-mode false`: TensorRT-LLM's `decoupled_mode` for the models its clients call by name.

Triton fixes a model's transaction policy in its config: a decoupled model streams, and unary `infer` (KServe
v2 HTTP `/infer`, gRPC `ModelInfer`, HTTP `/generate`) refuses it with 501; a model without the policy answers
unary calls, once each. tensorrtllm_backend lets the deployer choose, per deployment, by its `decoupled_mode`.
Here the engine's own model `llm` stays decoupled whichever is chosen (the shim streams from it), and the choice
is written into the configs of the two models TensorRT-LLM's clients call:

- `tensorrt_llm` (the face over llm) loses the decoupled policy: it relays each request to llm and answers once;
- `ensemble` takes `tensorrt_llm` instead of llm as its middle step, so it answers once too.

Both then refuse `streaming`/`stream` with TensorRT-LLM's message. The face takes TensorRT-LLM's types for
`early_stopping` (BOOL) and `lora_weights` (FP16); the ensemble's inputs of those names take them too, as an
ensemble's input must match the step it feeds.
"""

from __future__ import annotations

import re

from tritonllm.wire.triton_names import TritonNames

DECOUPLED = "model_transaction_policy { decoupled: true }"
FACE_TYPES = {"early_stopping": "TYPE_BOOL", "lora_weights": "TYPE_FP16"}


def unary_face(config: str) -> str:
    """tensorrt_llm's config without the decoupled policy."""
    if DECOUPLED not in config:
        raise ValueError(f"tensorrt_llm/config.pbtxt lacks '{DECOUPLED}'")
    return config.replace(DECOUPLED, "model_transaction_policy { decoupled: false }")


def unary_ensemble(config: str, names: TritonNames) -> str:
    """The ensemble's config with tensorrt_llm as its middle step (and its inputs' types where they feed it)."""
    step = f'model_name: "{names.llm}"'
    if config.count(step) != 1:
        raise ValueError(f"the ensemble's config must have one step on {names.llm}")
    config = config.replace(step, f'model_name: "{names.tensorrt_llm}"')
    for name, data_type in FACE_TYPES.items():
        config = re.sub(rf'(\{{ name: "{name}" data_type: )TYPE_\w+', rf"\g<1>{data_type}", config)
    return config
