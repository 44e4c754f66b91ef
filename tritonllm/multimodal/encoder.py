"""The model's media towers and projector, run by transformers' own modules: encoder inputs -> embedding rows, in
the order the prompt's placeholders name them. The language model is dropped after the load (the llm serves it).
Rows of media seen before come from a cache keyed by a digest of the inputs, so an image sent again in the next
turn of a chat is not encoded again."""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from tritonllm.formats.multimodal_folder import read_config
from tritonllm.formats.multimodal_folder import text_config as text_config_of
from tritonllm.multimodal.families import FAMILIES, MERGED, placeholder_ids

CACHE_BYTES = 256 << 20


class MediaEncoder:
    def __init__(self, model_dir: Path, cache_bytes: int = CACHE_BYTES) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers  # noqa: PLC0415 - only the encoders' process needs it

        config = read_config(model_dir)
        self.family = FAMILIES[config["model_type"]]
        model = getattr(transformers, self.family.loader).from_pretrained(model_dir, dtype="auto").eval()
        inner = model.model if hasattr(model, "model") and not hasattr(model, self.family.language_module) else model
        hidden = int(text_config_of(config)["hidden_size"])
        self.placeholder = min(placeholder_ids(config, self.family))
        self.dtype = next(p.dtype for p in inner.parameters())
        # the llm serves the language model: its weights are freed here
        kept = _Kept(hidden, self.dtype) if self.family.features == MERGED else None
        setattr(inner, self.family.language_module, kept)
        if hasattr(model, "lm_head"):
            model.lm_head = None
        self.model = inner
        self.cache: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.cache_bytes = cache_bytes
        self.hits = 0

    @torch.inference_mode()
    def embed(self, inputs: dict[str, np.ndarray]) -> torch.Tensor:
        """[rows, hidden] float32: the embeddings of one request's media."""
        key = _digest(inputs)
        rows = self.cache.get(key)
        if rows is not None:
            self.cache.move_to_end(key)
            self.hits += 1
            return rows
        rows = self._run(inputs)
        self.cache[key] = rows
        while sum(r.numel() * r.element_size() for r in self.cache.values()) > self.cache_bytes and len(self.cache) > 1:
            self.cache.popitem(last=False)
        return rows

    def _run(self, inputs: dict[str, np.ndarray]) -> torch.Tensor:
        tensors = {name: torch.from_numpy(np.ascontiguousarray(array)) for name, array in inputs.items()}
        count = int(tensors.pop("media_tokens").reshape(-1)[0])
        for name in ("pixel_values", "input_features"):
            if name in tensors:
                tensors[name] = tensors[name].to(self.dtype)
        if self.family.batched_images:
            tensors = {name: t[None] for name, t in tensors.items()}
        if self.family.features == MERGED:
            kept = getattr(self.model, self.family.language_module)
            self.model(input_ids=torch.full((1, count), self.placeholder), **tensors)
            return kept.embeddings[0].float()
        features = getattr(self.model, self.family.features)(**tensors, return_dict=True).pooler_output
        if isinstance(features, list | tuple):
            features = torch.cat([f.reshape(-1, f.shape[-1]) for f in features])
        return features.reshape(-1, features.shape[-1]).float()


class _Kept(torch.nn.Module):
    """Stands in for a language model: keeps the embeddings its forward pass is given (the placeholders' rows, as
    the model merged them in) and gives zeros for the token embeddings it is asked for."""

    def __init__(self, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.hidden, self.dtype = hidden, dtype
        self.embeddings: torch.Tensor | None = None

    def get_input_embeddings(self):
        return lambda ids: torch.zeros(*ids.shape, self.hidden, dtype=self.dtype)

    def forward(self, inputs_embeds: torch.Tensor, **_):
        from transformers.modeling_outputs import BaseModelOutputWithPast  # noqa: PLC0415

        self.embeddings = inputs_embeds
        return BaseModelOutputWithPast(last_hidden_state=inputs_embeds)


def _digest(inputs: dict[str, np.ndarray]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(inputs):
        array = np.ascontiguousarray(inputs[name])
        h.update(f"{name}{array.dtype}{array.shape}".encode())
        h.update(array.data)
    return h.digest()
