"""POST /tokenize and /detokenize, GET /tokenizer_info, with vLLM's shapes, through `preprocessing` and
`postprocessing`: the ids are exactly those a generation of the same prompt starts from. With these three,
lm-eval's remote tokenizer needs no local copy of the model's tokenizer."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from tritonllm.shim.errors import APIError, json_body
from tritonllm.shim.openai_protocol import INT32_MAX, ChatMessage, ToolObject
from tritonllm.shim.serving_base import check_size
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_errors import TritonRequestError, TritonUnavailable
from tritonllm.shim.triton_requests import TokenizeRequest


class TokenizeBody(BaseModel):
    """A `prompt`, or chat `messages` rendered with the model's chat template, as vLLM takes them."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    tools: list[ToolObject] | None = None
    # the tokenizer's special tokens (a BOS): by default for a prompt, not for messages, whose template writes them
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None  # default: true, false with continue_final_message
    continue_final_message: bool = False
    return_token_strs: bool = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=INT32_MAX)]]


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    def llm_of(name: str | None) -> str | None:
        """The LLM whose tokenizer a request means: its `model` (optional here, as in vLLM), else the first."""
        return None if name is None else settings.served(name).model.name

    async def run(call) -> Any:
        try:
            return await call
        except TritonRequestError as e:
            error = APIError.refused(e)
            error.param = FIELDS.get(error.param, error.param)
            raise error from e
        except TritonUnavailable as e:
            raise APIError(503, str(e)) from e

    @router.post("/tokenize")
    async def tokenize(request: Request, body: Annotated[TokenizeBody, Depends(json_body(TokenizeBody))]) -> dict:
        model = llm_of(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give either prompt or messages", "prompt")
        if body.messages is not None:
            messages = [m.rendered(i) for i, m in enumerate(body.messages)]
            check_size(sum(len(m["content"]) for m in messages), "messages")
            continued = body.continue_final_message
            if continued and body.add_generation_prompt:
                raise APIError(
                    400, "continue_final_message needs add_generation_prompt: false", "continue_final_message"
                )
            tokenize_request = TokenizeRequest(
                messages=messages,
                tools=[t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None,
                add_special_tokens=bool(body.add_special_tokens),
                add_generation_prompt=not continued
                if body.add_generation_prompt is None
                else body.add_generation_prompt,
                continue_final_message=continued,
            )
        else:
            check_size(len(body.prompt), "prompt")
            tokenize_request = TokenizeRequest(
                text=body.prompt, add_special_tokens=body.add_special_tokens is not False
            )
        tokenize_request.token_strs = body.return_token_strs
        tokenize_request.model = model
        tokenized = await run(request.app.state.triton.tokenize(tokenize_request))
        return {
            "count": len(tokenized.ids),
            "max_model_len": tokenized.context_len,
            "tokens": tokenized.ids,
            "token_strs": tokenized.token_strs,
        }

    @router.get("/tokenizer_info")
    async def tokenizer_info(request: Request, model: str | None = None) -> dict:
        return await run(request.app.state.triton.tokenizer_info(llm_of(model)))

    @router.post("/detokenize")
    async def detokenize(request: Request, body: Annotated[DetokenizeBody, Depends(json_body(DetokenizeBody))]) -> dict:
        return {"prompt": await run(request.app.state.triton.detokenize(body.tokens, llm_of(body.model)))}

    return router


# the request field of each tensor that preprocessing or postprocessing may refuse
FIELDS = {"chat_messages": "messages", "chat_tools": "tools", "text_input": "prompt", "output_ids": "tokens"}
