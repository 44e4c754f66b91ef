"""llama.cpp's router routes for a server with a bound on loaded LLMs (`serve --models-max`): `GET /models` with
each one's state, `POST /models/load` and `POST /models/unload` with `{"model": name}`. Behind the API key, as every
route but /health."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from tritonllm.shim.errors import APIError
from tritonllm.shim.settings import ShimSettings


class ModelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    def llm_of(name: str) -> str:
        served = settings.served(name)
        if served.lora is not None:
            raise APIError(400, f"{name!r} is a LoRA adapter of {served.model.name!r}; load or unload that", "model")
        return served.model.name

    @router.get("/models")
    async def models(request: Request) -> dict:
        states = await request.app.state.triton.states()
        return {"data": [{"id": name, "status": {"value": state}} for name, state in states.items()]}

    @router.post("/models/load")
    async def load(request: Request, body: ModelBody) -> dict:
        await request.app.state.triton.load(llm_of(body.model))
        return {"success": True}

    @router.post("/models/unload")
    async def unload(request: Request, body: ModelBody) -> dict:
        await request.app.state.triton.unload(llm_of(body.model))
        return {"success": True}

    return router
