"""The model's media towers and projector, run by transformers' own modules: encoder inputs -> embedding rows, in
the order the prompt's media tokens name them (each kind's rows in turn, as the model merges them), and for an
M-RoPE model each prompt token's three rotary positions, from the model's own get_rope_index. The language model
is dropped after the load (the llm serves it). Rows of media seen before come from a cache keyed by a digest of
the inputs, so an image sent again in the next turn of a chat is not encoded again."""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tritonllm.formats.multimodal_folder import read_config
from tritonllm.formats.multimodal_folder import text_config as text_config_of
from tritonllm.multimodal.families import FAMILIES, FEATURE_INPUTS, MERGED, placeholder_ids

CACHE_BYTES = 256 << 20
# the inputs whose rows stack across requests; the others are one request's own (its prompt, its rows' count)
STACKED = frozenset(
    {
        "pixel_values",
        "pixel_attention_mask",
        "pixel_patches",
        "image_grid_thw",
        "video_patches",
        "video_grid_thw",
        "input_features",
        "feature_attention_mask",
    }
)


@dataclass(frozen=True)
class Encoded:
    rows: torch.Tensor  # [rows, hidden] float32
    rope_positions: torch.Tensor | None = None  # M-RoPE's [3, prompt length]
    rope_delta: int = 0  # a token past the prompt: its place + delta

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()


class MediaEncoder:
    def __init__(self, model_dir: Path, cache_bytes: int = CACHE_BYTES) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers  # noqa: PLC0415 - only the encoders' process needs it

        config = read_config(model_dir)
        self.family = FAMILIES[config["model_type"]]
        model = getattr(transformers, self.family.loader).from_pretrained(model_dir, dtype="auto").eval()
        inner = model.model if hasattr(model, "model") and not hasattr(model, self.family.language_module) else model
        hidden = int(text_config_of(config)["hidden_size"])
        self.placeholders = placeholder_ids(config, self.family)
        self.dtype = next(p.dtype for p in inner.parameters())
        # the llm serves the language model: its weights are freed here (a merged forward pass gets a stand-in)
        kept = _Kept(hidden, self.dtype) if MERGED in self.family.features.values() else None
        setattr(inner, self.family.language_module, kept)
        if hasattr(model, "lm_head"):
            model.lm_head = None
        self.model = inner
        self.cache: OrderedDict[bytes, Encoded] = OrderedDict()
        self.cache_bytes = cache_bytes
        self.hits = 0

    def embed(self, inputs: dict[str, np.ndarray]) -> Encoded:
        """One request's media: their embedding rows (and M-RoPE's positions)."""
        return self.embed_all([inputs])[0]

    @torch.inference_mode()
    def embed_all(self, requests: list[dict[str, np.ndarray]]) -> list[Encoded]:
        """Several requests' media, each answered from the cache or encoded: the towers run once over the
        requests whose media are of one kind and one shape (their inputs stacked), once each for the others."""
        keys = [_digest(inputs) for inputs in requests]
        answers: list[Encoded | None] = [self.cache.get(key) for key in keys]
        for key, answer in zip(keys, answers, strict=True):
            if answer is not None:
                self.cache.move_to_end(key)
                self.hits += 1
        missing = [i for i, answer in enumerate(answers) if answer is None]
        for group in _stackable(requests, missing):
            for i, encoded in zip(group, self._run([requests[i] for i in group]), strict=True):
                answers[i] = self.cache[keys[i]] = encoded
        while sum(e.nbytes for e in self.cache.values()) > self.cache_bytes and len(self.cache) > 1:
            self.cache.popitem(last=False)
        return answers

    def _run(self, requests: list[dict[str, np.ndarray]]) -> list[Encoded]:
        """The media of requests that stack (each input's rows one after the other), each request's rows apart."""
        counts = [int(inputs["media_tokens"].reshape(-1)[0]) for inputs in requests]
        stacked = {name: np.concatenate([r[name] for r in requests]) for name in requests[0] if name in STACKED}
        rows = self._rows(stacked, sum(counts))
        split = list(torch.split(rows, counts))
        return [self._positioned(inputs, part) for inputs, part in zip(requests, split, strict=True)]

    def _rows(self, inputs: dict[str, np.ndarray], count: int) -> torch.Tensor:
        named = {v: k for k, v in self.family.renamed.items()}
        tensors = {named.get(n, n): torch.from_numpy(np.ascontiguousarray(a)) for n, a in inputs.items()}
        for name in ("pixel_values", "pixel_values_videos", "input_features"):
            if name in tensors:
                tensors[name] = tensors[name].to(self.dtype)
        if self.family.batched_images:
            tensors = {name: t[None] for name, t in tensors.items()}
        rows = []
        for kind, method in self.family.features.items():
            given = {name: tensors[name] for name in FEATURE_INPUTS[kind] if name in tensors}
            if not given:
                continue
            if method == MERGED:
                kept = getattr(self.model, self.family.language_module)
                self.model(input_ids=torch.full((1, count), self.placeholders[kind]), **given)
                rows.append(kept.embeddings[0])
                continue
            features = getattr(self.model, method)(**given, return_dict=True).pooler_output
            parts = features if isinstance(features, list | tuple) else [features]
            rows += [f.reshape(-1, f.shape[-1]) for f in parts]
        return torch.cat(rows).float()

    def _positioned(self, inputs: dict[str, np.ndarray], rows: torch.Tensor) -> Encoded:
        """One request's rows, with M-RoPE's positions for its prompt where the model has them."""
        if not self.family.mrope:
            return Encoded(rows)
        grids = {
            name: torch.from_numpy(inputs[name]) for name in ("image_grid_thw", "video_grid_thw") if name in inputs
        }
        positions, delta = self.model.get_rope_index(
            torch.from_numpy(inputs["input_ids"])[None], torch.from_numpy(inputs["mm_token_type_ids"])[None], **grids
        )
        return Encoded(rows, positions[:, 0].to(torch.int32), int(delta.reshape(-1)[0]))


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


def _stackable(requests: list[dict[str, np.ndarray]], indices: list[int]) -> list[list[int]]:
    """`indices` grouped by what their media stack on: the same inputs, each of the same trailing shape. A request
    with two kinds of media (an image and a video) is a group of its own, as each kind's rows come in turn."""
    groups: dict[tuple, list[int]] = {}
    for i in indices:
        inputs = requests[i]
        kinds = sum(name in inputs for name in ("pixel_values", "pixel_patches", "video_patches", "input_features"))
        shape = tuple((name, inputs[name].shape[1:]) for name in sorted(inputs) if name in STACKED)
        groups.setdefault(("alone", i) if kinds > 1 else shape, []).append(i)
    return list(groups.values())


def _digest(inputs: dict[str, np.ndarray]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(inputs):
        array = np.ascontiguousarray(inputs[name])
        h.update(f"{name}{array.dtype}{array.shape}".encode())
        h.update(array.data)
    return h.digest()
