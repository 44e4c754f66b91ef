"""The fields vLLM's OpenAI server takes on chat and completions beyond OpenAI's own, as clients send them
(LangChain's and LiteLLM's vLLM providers, `extra_body` in the OpenAI SDK).

Each one is honoured, or refused with a 400 naming it when it asks for something this server does not do:
never taken and dropped. Fields no server of this kind knows are another matter: errors.json_body drops them
with a Warning header, as vLLM does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, Field

from tritonllm.common.request_parameters import INT32_MAX, LOWEST_PRIORITY
from tritonllm.shim.errors import APIError
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
    # vLLM: lower runs earlier, 0 by default; here 1 (first) .. 5 (last, the default), 0 meaning the default
    priority: Annotated[int, Field(ge=0, le=LOWEST_PRIORITY)] | None = None
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

    def named(self, tokens: list[TokenLogprob]) -> list[TokenLogprob]:
        """Log-probs' tokens as the request wants them named."""
        return [t.as_token_ids() for t in tokens] if self.return_tokens_as_token_ids else tokens

    @property
    def engine_priority(self) -> int | None:
        return self.priority or None

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
    except json.JSONDecodeError as e:
        raise APIError(400, f"{name}: not a JSON schema ({e})", name) from e
    if not isinstance(schema, dict):
        raise APIError(400, f"{name}: a JSON schema is an object", name)
    return schema
