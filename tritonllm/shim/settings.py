"""The shim's settings: where Triton is, and how the served models and their LoRA adapters are named."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from tritonllm.formats.lora_adapters import LoraAdapter
from tritonllm.shim.errors import APIError
from tritonllm.shim.lora_registry import LoraRegistry
from tritonllm.wire.triton_names import TritonNames

if TYPE_CHECKING:
    from tritonllm.shim.triton_requests import GenerationRequest


@dataclass(frozen=True)
class ServedModel:
    """An LLM beside the first one (launcher/model_set.py): its name, its Triton models and how it writes."""

    name: str
    triton: TritonNames
    tool_call_parser: str = "json"
    reasoning_parser: str = "none"
    media: tuple[str, ...] = ()  # the media its prompts may carry (image, audio, video); none: text only


class Served(NamedTuple):
    """What a request's `model` names: an LLM, the LoRA adapter on it (None: the LLM itself), and the settings
    with that LLM's name and formats."""

    model: ServedModel
    lora: LoraAdapter | None
    settings: ShimSettings

    def onto(self, request: GenerationRequest) -> GenerationRequest:
        """`request` for this LLM and adapter."""
        request.model, request.lora = self.model.name, self.lora
        return request


@dataclass(frozen=True)
class ShimSettings:
    triton_grpc_url: str = "127.0.0.1:8001"
    served_model_name: str = "SmolLM2-135M-Instruct"
    # /v1/embeddings, served by the `embedding` model; None: the server has no embedding model
    embedding_model_name: str | None = "all-MiniLM-L6-v2"
    # /v1/rerank and /v1/score, served by the `reranker` model; None: the server has none
    rerank_model_name: str | None = None
    default_max_tokens: int = 256  # requests that give no max_tokens
    # fullTextEnabled in the specs: each streamed event carries the whole text so far
    full_text_enabled: bool = False
    # How the model writes tool calls (tritonllm.tokenizer.tool_calls.FORMATS); `serve` detects it from the model.
    tool_call_parser: str = "json"
    # How the model's thinking is told from its answer (tritonllm.tokenizer.reasoning.FORMATS, or "none": all of
    # it is content); `serve` detects it from the model.
    reasoning_parser: str = "none"
    # the media the first LLM's prompts may carry (image, audio, video); `serve` reads them from its config
    media: tuple[str, ...] = ()
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
    # the Batch API's database: its files, jobs and their progress (None: a temporary folder, gone at the stop;
    # the command line's default is a folder under the user's cache)
    batch_dir: str | None = None
    # LoRA adapters served by name (vLLM's --lora-modules: name=path of a PEFT folder), and whether
    # /v1/load_lora_adapter and /v1/unload_lora_adapter may change them at run time
    lora_modules: tuple[str, ...] = ()
    allow_runtime_lora: bool = False
    # the LLMs served beside the first (serve --model-dir A --model-dir B, --models-folder); LoRA adapters are the
    # first one's
    more_models: tuple[ServedModel, ...] = ()
    # with several LLMs, how many may be loaded at once: a model not loaded is loaded at its first request, the
    # least recently used idle one unloaded first; None: all stay loaded
    models_max: int | None = None
    started: int = field(default_factory=lambda: int(time.time()))
    # the adapters loaded (serve loads them before tritonserver starts); None: loaded here from lora_modules
    loras: LoraRegistry | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.loras is None:
            object.__setattr__(self, "loras", LoraRegistry(self.served_model_name, self.lora_modules))

    def llms(self) -> list[ServedModel]:
        first = ServedModel(
            self.served_model_name, TritonNames(), self.tool_call_parser, self.reasoning_parser, self.media
        )
        return [first, *self.more_models]

    def served(self, name: str) -> Served:
        """The LLM or LoRA adapter `name` names; a 404 naming what is served unless it is one."""
        for model in self.more_models:
            if model.name == name:
                view = dataclasses.replace(
                    self,
                    served_model_name=model.name,
                    tool_call_parser=model.tool_call_parser,
                    reasoning_parser=model.reasoning_parser,
                    media=model.media,
                )
                return Served(model, None, view)
        try:
            lora = self.loras.served(name)
        except APIError:
            names = [*self.loras.names(), *(m.name for m in self.more_models)]
            raise APIError(404, f"model {name!r} does not exist; this server has {names}", "model") from None
        return Served(self.llms()[0], lora, self)
