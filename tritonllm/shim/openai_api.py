"""OpenAI routes: /v1/chat/completions, /v1/completions, /v1/models, mapped onto the ensemble's tensors.

The bodies are in openai_protocol, their mapping and rendering in openai_serving; /v1/models lists the
embedding model and the LoRA adapters too; /v1/embeddings lives in embeddings_api.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tritonllm.common.request_parameters import BACKGROUND_PRIORITY
from tritonllm.shim.batch_runner import BACKGROUND
from tritonllm.shim.errors import APIError, json_body
from tritonllm.shim.generation import primed, until_disconnected
from tritonllm.shim.openai_protocol import ChatRequest, CompletionRequest, SamplingFields
from tritonllm.shim.serving_base import Choice, Render, check_size, generated_pieces
from tritonllm.shim.serving_chat import ChatRender, chat_generation
from tritonllm.shim.serving_completion import CompletionRender
from tritonllm.shim.settings import Served, ShimSettings
from tritonllm.shim.triton_requests import GenerationRequest

ChatBody = Annotated[ChatRequest, Depends(json_body(ChatRequest))]
CompletionBody = Annotated[CompletionRequest, Depends(json_body(CompletionRequest))]


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    def check_model(body: SamplingFields) -> Served:
        """The LLM the body names, the first one when it names none (as vLLM and llama.cpp's server)."""
        name = body.model = body.model or settings.served_model_name
        if name == settings.embedding_model_name:
            raise APIError(400, f"model {name!r} only embeds; use /v1/embeddings", "model")
        return settings.served(name)

    async def run(request: Request, body: SamplingFields, gens: list[GenerationRequest], render: Render) -> Any:
        client = request.app.state.triton
        if getattr(request.state, BACKGROUND, False):  # a Batch API line: after every client's request
            for gen in gens:
                gen.priority = BACKGROUND_PRIORITY
        include = bool(body.include_stop_str_in_output)
        per = gens[0].num_samples
        if body.stream and not render.whole_only:
            pieces = await until_disconnected(
                request, primed(generated_pieces(client, gens, body.stop or [], include, per))
            )
            return StreamingResponse(render.stream(pieces), media_type="text/event-stream")

        async def collect() -> list[Choice]:
            choices = [render.new_choice() for _ in range(len(gens) * per)]
            async with aclosing(generated_pieces(client, gens, body.stop or [], include, per)) as pieces:
                async for index, piece in pieces:
                    choices[index].add(piece)
            return choices

        choices = await until_disconnected(request, collect())
        if body.stream:  # beam search streams "fake": every choice in one event
            return StreamingResponse(render.whole_stream(choices), media_type="text/event-stream")
        return JSONResponse(render.whole(choices))

    async def cards(request: Request) -> dict[str, dict]:
        """Each served model's card, with vLLM's `root`, `parent` and `max_model_len` (an adapter's root is its
        folder, its parent the LLM); an LLM's says what its prompts take (`input_modalities`, text first)."""
        takes = {model.name: ["text", *model.media] for model in settings.llms()}
        names = [name for name in (*takes, settings.embedding_model_name, settings.rerank_model_name) if name]
        own = []
        for name in names:
            card = {"id": name, "object": "model", "created": settings.started, "owned_by": "tritonllm"}
            card |= {"root": name, "parent": None, "max_model_len": None}
            if name in takes:
                card |= await request.app.state.triton.card_facts(name)
                card["root"] = card["root"] or name
                card["input_modalities"] = takes[name]
            own.append(card)
        return {card["id"]: card for card in own + settings.loras.cards(settings.started)}

    @router.get("/v1/models")
    async def models(request: Request) -> dict:
        return {"object": "list", "data": list((await cards(request)).values())}

    @router.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> dict:
        served = await cards(request)
        if model_id not in served:
            raise APIError(404, f"model {model_id!r} does not exist; this server has {sorted(served)}", "model")
        return served[model_id]

    @router.post("/v1/chat/completions")
    async def chat(request: Request, body: ChatBody) -> Any:
        served = check_model(body)
        gen = served.onto(chat_generation(body, served.settings))
        return await run(request, body, [gen], ChatRender(body, served.settings))

    @router.post("/v1/completions")
    async def completions(request: Request, body: CompletionBody) -> Any:
        served = check_model(body)
        body.check()
        check_size(sum(len(p) for p in body.prompt), "prompt")
        gens = []
        for prompt in body.prompt:
            gen = body.generation_request(
                settings.default_max_tokens,
                **({"text": prompt} if isinstance(prompt, str) else {"prompt_ids": prompt}),
                use_raw_prompt=bool(body.use_raw_prompt) or None,
                truncate_prompt=body.error_behavior == "truncate" or None,
            )
            served.onto(gen)
            n = body.n or 1
            if body.use_beam_search:
                gen.beam_width, gen.num_samples, gen.temperature = max(n, body.best_of or n, 2), n, None
            elif (body.best_of or n) > n:
                gen.num_samples, gen.logprobs = body.best_of, True  # the best n by cumulative log-prob
            if body.logprobs is not None:
                gen.logprobs, gen.top_logprobs = True, body.logprobs
                gen.prompt_logprobs = bool(body.echo) or None
            if body.echo and not isinstance(prompt, str):
                gen.prompt_logprobs = True  # they bring the prompt's text back too, which echo shows
            if body.max_tokens == 0:
                gen.max_tokens = 1
            gens.append(body.applied(gen))
        return await run(request, body, gens, CompletionRender(body, served.settings))

    return router
