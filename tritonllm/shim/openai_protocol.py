"""The OpenAI request bodies the shim accepts (chat and completions), with their ranges and checks."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tritonllm.common.request_parameters import INT32_MAX, UINT64_MAX
from tritonllm.shim.errors import APIError
from tritonllm.shim.triton_requests import GenerationRequest
from tritonllm.shim.vllm_fields import VLLMFields
from tritonllm.tokenizer.tool_calls import ToolCallFormat

MAX_TEXT_CHARS = 4 * 1024 * 1024  # the specs' limit on a request's text
MAX_TOOLS = 32
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class StreamOptions(BaseModel):
    """Where a stream's usage goes. Left out: on the last choice chunk (the pages' streaming examples); include_usage
    true: in a chunk of its own after the choices (OpenAI), and with continuous_usage_stats (vLLM's) on every chunk
    too; include_usage false: nowhere."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = False


class SamplingFields(VLLMFields):
    """What chat and completions share; ranges as the spec pages give them."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # left out: the first served LLM (vLLM's and llama.cpp's default)
    max_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: int | None = None
    seed: Annotated[int, Field(ge=0, le=UINT64_MAX)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = False
    skip_special_tokens: bool | None = True
    ignore_eos: bool | None = False
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = 1
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None  # token id -> bias
    # Fields of OpenAI's API that cannot change what a text model served here answers: accepted, ignored.
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and v != -1 and not 0 < v <= INT32_MAX:
            raise ValueError("top_k must be -1 or in (0, 2147483647]")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if any(len(s) < 1 for s in stops) or sum(len(s) for s in stops) > 32768:
            raise ValueError("stop strings must be non-empty and 32768 characters at most in total")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        if v is not None and not all(key.isdigit() for key in v):
            raise ValueError("keys must be token ids (strings of digits)")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_token_ids(cls, v):
        return None if v is None else [t for t in v if -(2**31) <= t < 2**31]  # the spec ignores the rest

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    def check(self) -> None:
        """OpenAI's rules across fields that both routes share."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options needs stream: true", "stream_options")
        self.check_vllm_fields(bool(self.stream))

    def generation_request(self, default_max_tokens: int, **content: Any) -> GenerationRequest:
        top_k = None if self.top_k is None else (0 if self.top_k == -1 else self.top_k)
        content.setdefault("guide", self.vendor_guide())
        return GenerationRequest(
            max_tokens=self.output_limit or default_max_tokens,
            # a limit the client set must fit after the prompt (OpenAI's 400); the default stops at the context
            max_tokens_must_fit=self.output_limit is not None or None,
            # OpenAI's default temperature is 1.0 (sampling); 0 asks for greedy decoding.
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            min_tokens=self.min_tokens or None,
            priority=self.engine_priority,
            stop_token_ids=self.stop_token_ids or None,
            logit_bias={int(token): bias for token, bias in self.logit_bias.items()} if self.logit_bias else None,
            include_stop_str_in_output=bool(self.include_stop_str_in_output),
            skip_special_tokens=self.skip_special_tokens is not False,
            ignore_eos=bool(self.ignore_eos),
            num_samples=self.n or 1,
            stream=True,  # even for a whole answer: the tokens' arrival times give decode_time_arr
            **content,
        )


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: text the answer is expected to repeat, as an edited file repeats the file."""

    type: Literal["content"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        parts = []
        for i, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, "a prediction's content parts are text parts", f"prediction.content.{i}")
            parts.append(part["text"])
        return "".join(parts)


TEXT_PARTS = frozenset({"text", "input_text"})


def text_chars(content: str | list | None) -> int:
    """The characters of a message's text, its media parts aside (the pages' size limit is on text)."""
    if isinstance(content, list):
        return sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict) and p.get("type") in TEXT_PARTS)
    return len(content or "")


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an assistant's thinking sent back (vLLM's name), for templates that show it

    def rendered(self, index: int, where: str = "messages", media: tuple[str, ...] = ()) -> dict:
        """The message as the chat template takes it; errors name it as `where`.index. `media`: what the model
        takes beside text; content parts that carry media go on to preprocessing as they are, which reads them."""
        field = f"{where}.{index}.content"
        if self.role == "tool" and not self.tool_call_id:
            raise APIError(400, f"{where}.{index}.tool_call_id is required for tool messages", field)
        content = self.content
        if isinstance(content, list):
            kinds = {part.get("type") if isinstance(part, dict) else None for part in content} - TEXT_PARTS
            if kinds and not media:
                raise APIError(400, f"{field}: this model takes text only, not {sorted(map(str, kinds))}", field)
            if not kinds:
                content = "".join(str(part.get("text", "")) for part in content)
        if not content and not (self.role == "assistant" and self.tool_calls) and self.role != "tool":
            raise APIError(400, f"{field} must not be empty", field)
        # OpenAI's SDKs send instructions as "developer" for newer models; chat templates know them as "system".
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.tool_calls:
            for call in self.tool_calls:
                function = call.get("function") or {}
                if not isinstance(function.get("name"), str) or not isinstance(function.get("arguments"), str):
                    raise APIError(400, f"{where}.{index}.tool_calls: each needs function.name and arguments")
            # The template renders arguments as an object; OpenAI sends them as a JSON string.
            out["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _json_or_text(c["function"]["arguments"])}}
                for c in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None and self.role == "assistant":
            out["reasoning_content"] = self.reasoning_content
        return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


class FunctionObject(BaseModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = False


class ToolObject(BaseModel):
    type: Literal["function"]
    function: FunctionObject


class JsonSchemaObject(BaseModel):
    name: str
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    strict: bool | None = False


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaObject | None = None


class ChatRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None  # max_tokens' new name
    # Deprecated spellings of tools and tool_choice, still in the API reference.
    functions: Annotated[list[FunctionObject], Field(max_length=MAX_TOOLS)] | None = None
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None
    # A template variable, as vLLM passes it (gpt-oss's and Granite's templates read it); others ignore it.
    reasoning_effort: str | None = None
    # Accepted and ignored: it cannot change a text model's answer here.
    verbosity: str | None = None
    # How the messages are rendered (vLLM's fields): without the assistant's opening, the last (assistant's)
    # message continued, variables for the template, a template of the request's own (with
    # --trust-request-chat-template), and echo: the continued message's text repeated before the answer.
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = False
    add_special_tokens: bool | None = False  # the tokenizer's special tokens (a BOS) on top of the template's
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    echo: bool | None = False
    # a reasoning model's thinking tokens before its closing tag is forced (default: serve --reasoning-budget)
    max_thinking_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None

    # Predicted Outputs: its tokens are drafts the engine verifies (the answer does not change, it comes sooner).
    prediction: Prediction | None = None
    # They would change the answer, and cannot be honoured: refused when they ask for something.
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def template_variables(self) -> dict[str, Any]:
        variables = {"reasoning_effort": self.reasoning_effort} if self.reasoning_effort else {}
        return {**variables, **(self.chat_template_kwargs or {})}

    def echoed(self) -> str:
        """What echo repeats: the last message's text, when it is the assistant's (the one continued)."""
        last = self.messages[-1]
        return last.rendered(len(self.messages) - 1)["content"] if self.echo and last.role == "assistant" else ""

    def check(self) -> None:
        super().check()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        if self.modalities and set(self.modalities) - {"text"}:
            raise APIError(400, f"modalities: this model answers in text only, not {self.modalities}", "modalities")
        for name in ("audio", "web_search_options"):
            if getattr(self, name) is not None:
                raise APIError(400, f"{name}: this server cannot honour it", name)
        if self.functions:
            if self.tools:
                raise APIError(400, "give tools or the deprecated functions, not both", "functions")
            self.tools = [ToolObject(type="function", function=f) for f in self.functions]
            if self.function_call is not None and self.tool_choice is None:
                call = self.function_call
                self.tool_choice = call if isinstance(call, str) else {"type": "function", "function": call}

    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[ToolObject], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call
    response_format: ResponseFormat | None = None

    def forced_tools(self) -> tuple[list[dict], bool] | None:
        """The functions a call must be made to, and whether several calls may follow; None when not forced."""
        choice, functions = self.tool_choice, self.tool_functions()
        if choice == "required":
            if not functions:
                raise APIError(400, "tool_choice 'required' needs tools", "tool_choice")
            return functions, self.parallel_tool_calls is not False
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            named = [f for f in functions if f["name"] == name]
            if choice.get("type") != "function" or not named:
                raise APIError(400, f"tool_choice names no function among tools: {name!r}", "tool_choice")
            return named, False
        return None

    def tool_functions(self) -> list[dict]:
        return [t.function.model_dump(exclude_none=True) for t in self.tools or []]

    def tools_active(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def guide(self, tool_format: ToolCallFormat) -> tuple[str, str] | None:
        forced = self.forced_tools()
        fmt = self.response_format
        vendor = self.vendor_guide()
        if vendor is not None:
            if forced is not None or (fmt and fmt.type != "text"):
                raise APIError(
                    400,
                    "a guided_* or structured_outputs constraint cannot be combined with "
                    "response_format or a forced tool_choice",
                    "response_format",
                )
            return vendor
        if forced is not None:
            if fmt and fmt.type != "text":
                raise APIError(400, "response_format cannot be combined with a forced tool_choice", "response_format")
            return "lark", tool_format.grammar(*forced)
        if fmt is None or fmt.type == "text":
            if self.tools_active() and tool_format.guards_auto:
                several = self.parallel_tool_calls is not False
                return "lark", tool_format.grammar(self.tool_functions(), several, or_text=True)
            return None
        if fmt.type == "json_object":
            return "json", ""
        if fmt.json_schema is None:
            raise APIError(400, "response_format.json_schema is required for type json_schema", "response_format")
        return "json_schema", json.dumps(fmt.json_schema.schema_)


TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class CompletionRequest(SamplingFields):
    # text, texts, token ids, or lists of token ids (lm-eval's tokenized requests); one choice set per prompt
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None  # 0 only with echo: the prompt alone
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None
    use_beam_search: bool | None = False
    error_behavior: Literal["truncate", "error"] | None = "error"
    use_raw_prompt: bool | None = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        prompts = [v] if isinstance(v, str) or (v and isinstance(v[0], int)) else v
        if not prompts or any(not p for p in prompts):
            raise ValueError("prompt must be a non-empty string or token-id list, or a list of them")
        return prompts

    def check(self) -> None:
        """The completions page's rules for n, best_of and beam search; max_tokens 0 only to echo the prompt."""
        super().check()
        if self.max_tokens == 0 and not self.echo:
            raise APIError(
                400, "max_tokens: 0 is only allowed with echo (the prompt's log-probabilities)", "max_tokens"
            )
        n, best_of = self.n or 1, self.best_of
        if self.use_beam_search:
            if self.return_token_ids:
                raise APIError(400, "return_token_ids cannot be combined with use_beam_search", "return_token_ids")
            if self.stop:
                raise APIError(400, "use_beam_search cannot be combined with stop", "use_beam_search")
            return
        sampling = self.temperature is None or self.temperature > 0
        if (n > 1 or (best_of or 1) > 1) and not sampling:
            raise APIError(400, "n and best_of > 1 need temperature > 0", "temperature")
        if self.stream and best_of is not None and best_of != n:
            raise APIError(400, "when streaming, best_of must equal n", "best_of")
        if best_of is not None and best_of < n:
            raise APIError(400, f"best_of ({best_of}) must be >= n ({n})", "best_of")
