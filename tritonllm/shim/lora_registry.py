"""LoRA adapters served by name beside the base model, as vLLM serves them: `--lora-modules name=path` (PEFT
folders) at start, `POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter` at run time where the operator allows
it (`--allow-runtime-lora`; vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING), each listed in /v1/models with the base as
its parent.

A request naming an adapter goes out with the adapter's task id alone; the llm keeps recently used adapters by
task id (engine/layers/lora.py), and a request for one it does not hold is sent again once with the weights
(triton_client.TritonLLMClient.generate). An unloaded adapter stops being served at once; the llm forgets its
weights as newer adapters take their place.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from tritonllm.formats.lora_adapters import LoraAdapter, load_peft
from tritonllm.shim.errors import APIError


class NameTaken(ValueError):
    """An adapter asked to be served under a name already served."""


class LoraRegistry:
    def __init__(self, base_name: str, modules: Sequence[str] = ()) -> None:
        """`modules`: each `name=path`, or vLLM's JSON form {"name": ..., "path": ...}."""
        self.base_name = base_name
        self.adapters: dict[str, LoraAdapter] = {}
        for spec in modules:
            self.load(*parse_module(spec))

    def served(self, name: str) -> LoraAdapter | None:
        """The adapter a request's `model` names, None for the base model; a 404 naming what is served else."""
        if name == self.base_name:
            return None
        adapter = self.adapters.get(name)
        if adapter is None:
            raise APIError(404, f"model {name!r} does not exist; this server has {self.names()}", "model")
        return adapter

    def names(self) -> list[str]:
        return [self.base_name, *self.adapters]

    def load(self, name: str, path: Path) -> LoraAdapter:
        if name in self.names():
            raise NameTaken(f"LoRA adapter {name}: the name is served already")
        self.adapters[name] = adapter = load_peft(name, path)
        return adapter

    def unload(self, name: str) -> None:
        if self.adapters.pop(name, None) is None:
            raise APIError(404, f"LoRA adapter {name!r} is not loaded; loaded: {sorted(self.adapters)}", "lora_name")

    def cards(self, created: int) -> list[dict]:
        return [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "tritonllm",
                "root": str(adapter.path),
                "parent": self.base_name,
                "max_model_len": None,
            }
            for name, adapter in self.adapters.items()
        ]


def parse_module(spec: str) -> tuple[str, Path]:
    """`name=path` or {"name": ..., "path": ...} (vLLM's two spellings of a --lora-modules entry)."""
    if spec.lstrip().startswith("{"):
        given = json.loads(spec)
        if not isinstance(given, dict) or not {"name", "path"} <= set(given):
            raise ValueError(f"--lora-modules {spec}: a JSON entry needs name and path")
        return str(given["name"]), Path(given["path"])
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules {spec}: give name=path")
    return name, Path(path)


class LoadAdapter(BaseModel):
    lora_name: str
    lora_path: str


class UnloadAdapter(BaseModel):
    lora_name: str


def build_router(registry: LoraRegistry) -> APIRouter:
    """vLLM's runtime routes; mounted only where the operator allows loading from the server's own disk."""
    router = APIRouter()

    @router.post("/v1/load_lora_adapter")
    async def load(body: LoadAdapter) -> PlainTextResponse:
        try:
            registry.load(body.lora_name, Path(body.lora_path))
        except NameTaken as e:
            raise APIError(400, str(e), "lora_name") from e
        except (ValueError, OSError) as e:
            raise APIError(400, str(e), "lora_path") from e
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @router.post("/v1/unload_lora_adapter")
    async def unload(body: UnloadAdapter) -> PlainTextResponse:
        registry.unload(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return router
