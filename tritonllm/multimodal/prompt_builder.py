"""A chat with media -> its token ids and the encoders' inputs, through the model's own processor: the chat
template renders each media part's placeholder, the processor expands it to as many tokens as the towers give
rows (image splitting, dynamic resolution, audio length), and each of those tokens becomes an id from the
vocabulary size on, naming its row of the table the encoders return (TensorRT-LLM's prompt-table convention):
the images' tokens first rows in prompt order, then the videos', then the audio clips', as the encoders stack
them and as the model merges each kind."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonllm.formats.multimodal_folder import media_kinds, read_config, text_config
from tritonllm.media import decode
from tritonllm.media.errors import MediaError
from tritonllm.media.fetch import MediaPolicy, fetch
from tritonllm.media.kinds import KINDS
from tritonllm.multimodal.content_parts import MediaPart
from tritonllm.multimodal.families import ENCODER_INPUTS, FAMILIES, placeholder_ids

VIDEO_FRAMES = 8  # frames sampled evenly from a video


@dataclass
class MediaPrompt:
    ids: list[int]  # media tokens as vocab_size + their row
    encoder_inputs: dict[str, np.ndarray]
    media_tokens: int


class PromptBuilder:
    def __init__(self, model_dir: Path, policy: MediaPolicy) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        config = read_config(model_dir)
        self.kinds = media_kinds(model_dir)
        self.family = FAMILIES[config["model_type"]]
        self.processor = load_processor(model_dir)
        self.placeholders = placeholder_ids(config, self.family)  # kind -> id, in the rows' order
        self.vocab_size = int(text_config(config)["vocab_size"])
        self.policy = policy

    def build(self, messages: list, media: list[MediaPart], render: Callable[..., str]) -> MediaPrompt:
        """`render(processor, messages)`: the chat as text, placeholders in place, as the request asks it."""
        text = render(self.processor, messages)
        loaded = {kind: [] for kind in KINDS}
        for part in media:
            loaded[part.kind].append(self._decoded(part))
        arguments = {}
        for kind, name in (("image", "images"), ("video", "videos"), ("audio", "audio")):
            if loaded[kind]:
                arguments[name] = loaded[kind]
        if loaded["audio"]:
            arguments["sampling_rate"] = self.processor.feature_extractor.sampling_rate
        try:
            outputs = self.processor(text=[text], return_tensors="np", **arguments)
        except (ValueError, TypeError) as e:  # a count of placeholders and media that disagree, a size it refuses
            where = media[0].where if media else "messages"
            raise MediaError(where, f"{where}: the model's processor refused the media: {e}") from e
        written = [int(t) for t in np.asarray(outputs["input_ids"]).reshape(-1)]
        ids, rows = list(written), 0
        for placeholder in self.placeholders.values():
            for i, token in enumerate(written):
                if token == placeholder:
                    ids[i] = self.vocab_size + rows
                    rows += 1
        inputs = {}
        for name, array in outputs.items():
            name = self.family.renamed.get(name, name)
            if name in ENCODER_INPUTS and (name not in ("input_ids", "mm_token_type_ids") or self.family.mrope):
                dtype, rank = ENCODER_INPUTS[name]
                array = np.asarray(array).astype(dtype)
                inputs[name] = array.reshape(-1, *array.shape[array.ndim - rank + 1 :])
        inputs["media_tokens"] = np.array([rows], dtype=np.int32)
        return MediaPrompt(ids, inputs, rows)

    def _decoded(self, part: MediaPart):
        if part.pixels is not None:
            from PIL import Image  # noqa: PLC0415

            return Image.fromarray(np.ascontiguousarray(part.pixels), "RGB")
        data = fetch(part.reference, KINDS[part.kind], part.where, self.policy)
        if part.kind == "image":
            return decode.image(data, part.where, self.policy.max_image_pixels)
        if part.kind == "audio":
            return decode.audio(data, part.where, self.processor.feature_extractor.sampling_rate)
        return decode.video(data, part.where, VIDEO_FRAMES)


def load_processor(model_dir: Path):
    """The model's own processor (for Qwen2-VL, its class with frames made into patches without torchvision)."""
    family = read_config(model_dir)["model_type"]
    if family in ("qwen2_vl", "qwen2_5_vl"):
        from tritonllm.multimodal import qwen2_vl_processor  # noqa: PLC0415

        return qwen2_vl_processor.load(model_dir, family)
    from transformers import AutoProcessor  # noqa: PLC0415 - only a multimodal model's preprocessing needs it

    # the PIL-based image processors: the torchvision ones need a torchvision this torch cannot load
    return AutoProcessor.from_pretrained(model_dir, backend="pil")
