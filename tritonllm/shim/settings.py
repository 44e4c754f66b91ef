"""The shim's settings: where Triton is and how the served model and its LoRA adapters are named."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .lora_registry import LoraRegistry


@dataclass(frozen=True)
class ShimSettings:
    triton_grpc_url: str = "127.0.0.1:8001"
    served_model_name: str = "SmolLM2-135M-Instruct"
    # /v1/embeddings, served by the `embedding` model; None: the server has no embedding model
    embedding_model_name: str | None = "all-MiniLM-L6-v2"
    default_max_tokens: int = 256  # requests that give no max_tokens
    # fullTextEnabled in the specs: each streamed event carries the whole text so far
    full_text_enabled: bool = False
    # How the model writes tool calls (tritonllm.tokenizer.tool_calls.FORMATS); `serve` detects it from the model.
    tool_call_parser: str = "json"
    # How the model's thinking is told from its answer (tritonllm.tokenizer.reasoning.FORMATS, or "none": all of
    # it is content); `serve` detects it from the model.
    reasoning_parser: str = "none"
    # thinking tokens a chat may spend before its closing tag is forced, unless it says max_thinking_tokens; -1: any
    reasoning_budget: int = -1
    # constrained decoding (response_format, forced tools, guided_*) from the first token, thinking included; by
    # default a reasoning model thinks freely and the grammar applies to its answer (vLLM's enable_in_reasoning)
    guide_reasoning: bool = False
    # whether a request may bring its own chat template (vLLM's --trust-request-chat-template)
    trust_request_chat_template: bool = False
    # a field an OpenAI-style body does not declare: False, dropped with a Warning header (as vLLM); True, a 400
    strict_request_fields: bool = False
    # the shim's generations through the `ensemble` rather than preprocessing and llm directly (direct_route.py)
    through_ensemble: bool = False
    api_key: str | None = None  # when set, every route but /health needs `Authorization: Bearer <api_key>`
    # LoRA adapters served by name (vLLM's --lora-modules: name=path of a PEFT folder), and whether
    # /v1/load_lora_adapter and /v1/unload_lora_adapter may change them at run time
    lora_modules: tuple[str, ...] = ()
    allow_runtime_lora: bool = False
    started: int = field(default_factory=lambda: int(time.time()))
    # the adapters loaded (serve loads them before tritonserver starts); None: loaded here from lora_modules
    loras: LoraRegistry | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.loras is None:
            object.__setattr__(self, "loras", LoraRegistry(self.served_model_name, self.lora_modules))
