"""The shim's LLMs by served name, each through a TritonLLMClient of its own (launcher/model_set.py).

With a bound on how many may be loaded at once (`serve --models-max`, llama.cpp's router idea), a model that is
not loaded is loaded at its first request, through Triton's explicit model control; to make room, the least
recently used model that nothing uses is unloaded first, and the load waits for one to become idle when all are
in use. A generation holds its model from its first token to its last, so a model is never unloaded under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator

import numpy as np

from tritonllm.shim.errors import APIError
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_client import TritonLLMClient
from tritonllm.shim.triton_errors import TritonRequestError, TritonUnavailable
from tritonllm.shim.triton_requests import GenerationRequest, Tokenized, TokenizeRequest
from tritonllm.shim.triton_responses import ResponseDelta

UNLOAD_WAIT_S = 120.0  # for an unloaded model's processes to end, so that its memory is back before the next loads
POLL_S = 0.1
READY, UNLOADED = "READY", "UNAVAILABLE"  # Triton's model states (a model never loaded has none)


class ModelPool:
    def __init__(self, settings: ShimSettings) -> None:
        direct = not settings.through_ensemble
        self.clients = {
            model.name: TritonLLMClient(settings.triton_grpc_url, settings.api_key, direct, model.triton)
            for model in settings.llms()
        }
        self.first = self.clients[settings.served_model_name]
        self.models_max = settings.models_max
        self.in_use: Counter[str] = Counter()
        self.last_used: dict[str, float] = {}
        self._changing = asyncio.Lock()  # one load or unload at a time
        self._leaving: set[str] = set()  # being unloaded: a request for one waits to load it again
        self._released = asyncio.Condition()
        self._card_facts: dict[str, dict] = {}

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()

    async def ready(self) -> bool:
        """Whether the server answers and the loaded LLMs are ready (with a bound, some may be unloaded)."""
        if self.models_max is None:
            return all([await client.ready() for client in self.clients.values()])
        try:
            loaded = await self.first.model_states()
        except Exception:  # noqa: BLE001 - any failure to answer is "not ready"
            return False
        return any(loaded.get(client.names.ensemble) == READY for client in self.clients.values())

    async def generate(self, request: GenerationRequest) -> AsyncIterator[ResponseDelta]:
        async with self.using(request.model) as client, contextlib.aclosing(client.generate(request)) as deltas:
            async for delta in deltas:
                yield delta

    async def tokenize(self, request: TokenizeRequest) -> Tokenized:
        async with self.using(request.model) as client:
            return await client.tokenize(request)

    async def detokenize(self, ids: list[int], model: str | None = None) -> str:
        async with self.using(model) as client:
            return await client.detokenize(ids)

    async def tokenizer_info(self, model: str | None = None) -> dict:
        async with self.using(model) as client:
            return await client.tokenizer_info()

    async def card_facts(self, model: str) -> dict:
        """vLLM's `root` (the folder the LLM is served from) and `max_model_len` of its model card, remembered once
        known. An LLM that is not loaded is not loaded for them, and a server that does not answer gives none:
        the card lists the model all the same."""
        if model not in self._card_facts:
            client = self.clients[model]
            try:
                if self.models_max is not None and not await client.ready():
                    return {}
                info = await client.tokenizer_info()
            except (TritonRequestError, TritonUnavailable):
                return {}
            self._card_facts[model] = {"root": info["name_or_path"] or None, "max_model_len": info["model_max_length"]}
        return self._card_facts[model]

    async def embed(self, rows: list[str] | list[list[int]], instruction: str | None) -> tuple[np.ndarray, np.ndarray]:
        return await self.first.embed(rows, instruction)

    async def score(self, queries: list[str], documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return await self.first.score(queries, documents)

    async def states(self) -> dict[str, str]:
        """Each LLM's state as llama.cpp's router names them: loaded, loading, unloading or unloaded."""
        states = await self.first.model_states()
        named = {READY: "loaded", "LOADING": "loading", "UNLOADING": "unloading"}
        return {name: named.get(states.get(c.names.ensemble, ""), "unloaded") for name, c in self.clients.items()}

    async def load(self, name: str) -> None:
        async with self.using(name):
            pass

    async def unload(self, name: str) -> None:
        """Unloads `name` once no request uses it."""
        async with self._changing:
            await self._idle_one([name])
            await self._unload(name)

    @contextlib.asynccontextmanager
    async def using(self, model: str | None) -> AsyncIterator[TritonLLMClient]:
        """The client of `model` (None: the first LLM), loaded, and not unloaded until the block ends."""
        name = model or next(iter(self.clients))
        client = self.clients[name]
        self.in_use[name] += 1
        try:
            if self.models_max is not None and (name in self._leaving or not await client.ready()):
                await self._load(name)
            self.last_used[name] = time.monotonic()
            yield client
        finally:
            self.in_use[name] -= 1
            async with self._released:
                self._released.notify_all()

    async def _load(self, name: str) -> None:
        async with self._changing:
            client = self.clients[name]
            if await client.ready():  # loaded meanwhile, by a request that came first
                return
            states = await client.model_states()
            resident = [other for other, c in self.clients.items() if states.get(c.names.ensemble) == READY]
            while len(resident) >= self.models_max:
                victim = await self._idle_one(resident)
                await self._unload(victim)
                resident.remove(victim)
            try:
                await client.load()
            except TritonRequestError as e:
                raise APIError(503, f"model {name!r} could not be loaded: {e}", "model") from e

    async def _idle_one(self, resident: list[str]) -> str:
        """The least recently used of `resident` that nothing uses, once there is one."""
        async with self._released:
            await self._released.wait_for(lambda: any(self.in_use[other] == 0 for other in resident))
        idle = [other for other in resident if self.in_use[other] == 0]
        return min(idle, key=lambda other: self.last_used.get(other, 0.0))

    async def _unload(self, name: str) -> None:
        """Unloads `name` and waits until its models are gone (their processes ended, their memory returned)."""
        client = self.clients[name]
        self._leaving.add(name)
        try:
            await client.unload()
            gone_by = time.monotonic() + UNLOAD_WAIT_S
            parts = set(client.names.by_folder().values())
            while time.monotonic() < gone_by:
                states = await client.model_states()
                if all(states.get(part, UNLOADED) == UNLOADED for part in parts):
                    return
                await asyncio.sleep(POLL_S)
        finally:
            self._leaving.discard(name)
