"""Preprocessing's part in a prompt with media: the chat's media parts fetched, decoded and put through the
model's processor (multimodal/prompt_builder.py), then sent to the multimodal_encoders model, whose embedding
rows go to the llm beside the ids. A text model has none of this: `MediaPrompts.of` gives None."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonllm.formats.multimodal_folder import media_kinds
from tritonllm.media.fetch import MediaPolicy
from tritonllm.media.kinds import MAX_IMAGE_PIXELS
from tritonllm.multimodal.content_parts import split_messages, tensor_images

ALLOWED_LOCAL_MEDIA_PATH_ENV = "TRITONLLM_ALLOWED_LOCAL_MEDIA_PATH"
ALLOWED_MEDIA_DOMAINS_ENV = "TRITONLLM_ALLOWED_MEDIA_DOMAINS"
MAX_IMAGE_PIXELS_ENV = "TRITONLLM_MAX_IMAGE_PIXELS"
# the multimodal_encoders model's outputs: the rows, M-RoPE's positions ([3, 0] for other models), their delta
ENCODER_OUTPUTS = ("OUT_PROMPT_EMBEDDING_TABLE", "OUT_MROPE_POSITIONS", "OUT_MROPE_POSITION_DELTAS")


@dataclass(frozen=True)
class MediaRows:
    """What the encoders give for a prompt's media."""

    rows: np.ndarray  # [rows, hidden] float32, row k for id vocab_size + k
    rope_positions: np.ndarray | None = None  # M-RoPE's [3, prompt length] int32
    rope_delta: int = 0  # a token past the prompt sits at its place + delta


# encoder inputs (name -> array) -> what the multimodal_encoders model answers
Encode = Callable[[dict[str, np.ndarray]], MediaRows]


def media_policy(allowed_local_path: str = "", allowed_domains: str = "", max_image_pixels: str = "") -> MediaPolicy:
    """The flags' policy, through the environment `serve` sets (the parameters' values when it sets none)."""
    path = os.environ.get(ALLOWED_LOCAL_MEDIA_PATH_ENV) or allowed_local_path
    domains = os.environ.get(ALLOWED_MEDIA_DOMAINS_ENV) or allowed_domains
    pixels = os.environ.get(MAX_IMAGE_PIXELS_ENV) or max_image_pixels
    return MediaPolicy(
        allowed_local_path=Path(path).resolve() if path else None,
        allowed_domains=frozenset(d.strip().lower() for d in domains.split(",") if d.strip()) or None,
        max_image_pixels=int(pixels) if pixels else MAX_IMAGE_PIXELS,
    )


class MediaPrompts:
    def __init__(self, model_dir: Path, policy: MediaPolicy, encode: Encode) -> None:
        from tritonllm.multimodal.prompt_builder import PromptBuilder  # noqa: PLC0415 - transformers' processor

        self.builder = PromptBuilder(model_dir, policy)
        self.kinds = self.builder.kinds
        self.encode = encode

    @classmethod
    def of(cls, model_dir: Path, policy: MediaPolicy, encode: Encode | None) -> MediaPrompts | None:
        if not media_kinds(model_dir):
            return None
        if encode is None:
            raise RuntimeError(f"{model_dir} is a multimodal model, but preprocessing was given no encoder to call")
        return cls(model_dir, policy, encode)

    def images_of(self, urls: list[str], pixels: np.ndarray | None) -> list:
        """TensorRT-LLM's image_url_input and image_bytes_input as media parts."""
        return tensor_images(urls, pixels)

    def split(self, conversation: list) -> tuple[list, list]:
        return split_messages(conversation, self.kinds)

    def ids_and_rows(self, conversation: list, media: list, render) -> tuple[list[int], MediaRows]:
        """The prompt's ids (media tokens from the vocabulary size on) and the embedding rows they name."""
        prompt = self.builder.build(conversation, media, render)
        encoded = self.encode(prompt.encoder_inputs)
        if encoded.rows.shape[0] != prompt.media_tokens:
            raise RuntimeError(f"the encoders gave {encoded.rows.shape[0]} rows for {prompt.media_tokens} media tokens")
        return prompt.ids, encoded
