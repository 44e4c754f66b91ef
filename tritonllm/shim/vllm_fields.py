"""The fields vLLM's OpenAI server takes on chat and completions beyond OpenAI's own, as clients send them
(LangChain's and LiteLLM's vLLM providers, `extra_body` in the OpenAI SDK).

Each one is honoured, or refused with a 400 naming it when it asks for something this server does not do:
never taken and dropped. Fields no server of this kind knows are another matter: errors.json_body drops them
with a Warning header, as vLLM does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from tritonllm.common.request_parameters import HIGHEST_PRIORITY, INT32_MAX, LOWEST_PRIORITY, MAX_TOP_LOG_PROBS
from tritonllm.shim.errors import APIError
from tritonllm.shim.triton_requests import GenerationRequest
from tritonllm.shim.triton_responses import TokenLogprob


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its newer spelling of the guided_* fields): one constraint."""

    json_: Annotated[dict[str, Any] | str | None, Field(alias="json")] = None
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class VLLMFields(BaseModel):
    # SamplingParams of vLLM that the engine has
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    min_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    # vLLM's: lower runs earlier, 0 by default (any integer); onto the engine's ranks 1 (first) .. 5 (last, the
    # default) by 5 + priority, within them: -4 and below first, 0 and above with every request that sends none
    priority: Annotated[int, Field(ge=-INT32_MAX, le=INT32_MAX)] | None = None
    # Changes only what a slow (Python) tokenizer decodes, in vLLM as here; every tokenizer served here is fast.
    spaces_between_special_tokens: bool | None = True
    # constrained decoding, through the engine's grammars
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1)] | None = None
    guided_grammar: str | None = None
    # log-probs name each token `token_id:<id>`, as text alone may not tell tokens apart (RL trainers ask it)
    return_tokens_as_token_ids: bool | None = None
    # the ids of the prompt (top-level `prompt_token_ids`) and of each choice's tokens (`token_ids`), streamed too
    return_token_ids: bool | None = None
    # each prompt token's log-probability with this many alternatives (0: none), as `prompt_logprobs`;
    # vLLM's -1 (the whole vocabulary) is over its default --max-logprobs, as here
    prompt_logprobs: int | None = None
    # the prompt cut to its last (truncation_side "left", the default) or first ("right") this many tokens;
    # -1: to the context less the answer's room
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None

    def check_vllm_fields(self, streaming: bool) -> None:
        """vLLM's rules for its fields, as its protocol and engine refuse them."""
        k = self.prompt_logprobs
        if k is not None:
            if streaming:
                raise APIError(400, "prompt_logprobs are not available when stream is true", "prompt_logprobs")
            if k < 0 and k != -1:
                raise APIError(400, f"prompt_logprobs must be >= 0 or -1, got {k}", "prompt_logprobs")
            if k == -1 or k > MAX_TOP_LOG_PROBS:
                asked = "the whole vocabulary" if k == -1 else str(k)
                raise APIError(
                    400,
                    f"prompt_logprobs: {asked} alternatives asked for, more than the {MAX_TOP_LOG_PROBS} allowed",
                    "prompt_logprobs",
                )

    def applied(self, gen: GenerationRequest) -> GenerationRequest:
        """`gen` with what these fields ask of the engine. Prompt and answer share one count of alternatives on
        the wire: the larger is asked for, and each is cut to its own when rendered."""
        if self.prompt_logprobs is not None:
            gen.prompt_logprobs = True
            gen.top_logprobs = max(gen.top_logprobs or 0, self.prompt_logprobs) or None
        gen.prompt_ids_returned = self.return_token_ids or None
        gen.truncate_prompt_tokens, gen.truncation_side = self.truncate_prompt_tokens, self.truncation_side
        return gen

    def prompt_logprobs_of(self, tokens: list[TokenLogprob]) -> list[dict | None]:
        """vLLM's prompt_logprobs: None for the first token (nothing predicts it), then for each token, by id, its
        own log-probability and rank and those of the prompt_logprobs likeliest tokens."""
        k = self.prompt_logprobs or 0
        out: list[dict | None] = []
        for t in tokens:
            if t.logprob is None:
                out.append(None)
                continue
            entry = {str(t.token_id): {"logprob": t.logprob, "rank": t.rank, "decoded_token": t.token}}
            for rank, (token_id, (text, logprob)) in enumerate(zip(t.top_ids[:k], t.top[:k], strict=True), 1):
                entry.setdefault(str(token_id), {"logprob": logprob, "rank": rank, "decoded_token": text})
            out.append(entry)
        return out

    def named(self, tokens: list[TokenLogprob]) -> list[TokenLogprob]:
        """Log-probs' tokens as the request wants them named."""
        return [t.as_token_ids() for t in tokens] if self.return_tokens_as_token_ids else tokens

    @property
    def engine_priority(self) -> int | None:
        if self.priority is None:
            return None
        return min(max(LOWEST_PRIORITY + self.priority, HIGHEST_PRIORITY), LOWEST_PRIORITY)

    def vendor_guide(self) -> tuple[str, str] | None:
        """The engine guide (type, text) of the guided_* fields or structured_outputs; at most one may be given."""
        given = {name: getattr(self, name) for name in ("guided_json", "guided_regex", "guided_choice")}
        given["guided_grammar"] = self.guided_grammar
        if self.structured_outputs is not None:
            s = self.structured_outputs
            given |= {
                "structured_outputs.json": s.json_,
                "structured_outputs.regex": s.regex,
                "structured_outputs.choice": s.choice,
                "structured_outputs.grammar": s.grammar,
                "structured_outputs.json_object": s.json_object or None,
            }
        asked = {name: value for name, value in given.items() if value is not None}
        if not asked:
            return None
        if len(asked) > 1:
            raise APIError(400, f"give one constraint, not {sorted(asked)}", sorted(asked)[1])
        ((name, value),) = asked.items()
        kind = name.rsplit(".", 1)[-1].removeprefix("guided_")
        if kind == "json":
            schema = value if isinstance(value, dict) else _schema(value, name)
            return "json_schema", json.dumps(schema)
        if kind == "json_object":
            return "json", ""
        if kind == "regex":
            return "regex", value
        if kind == "choice":
            return "lark", "start: " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in value)
        return "lark", value  # a Lark grammar, as llguidance reads it


def _schema(text: str, name: str) -> dict:
    try:
        schema = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise APIError(400, f"{name}: not a JSON schema ({type(e).__name__}: {e})", name) from e
    if not isinstance(schema, dict):
        raise APIError(400, f"{name}: a JSON schema is an object", name)
    return schema
