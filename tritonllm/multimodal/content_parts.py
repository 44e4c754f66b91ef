"""OpenAI's and the API pages' content parts -> the messages a processor's chat template takes and the media they
name, in order. Each media part becomes `{"type": "image"}` (or audio, video) where it stood; its reference is
fetched later. Errors name the part where it sits (`messages[0].content[1].image_url`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tritonllm.media.errors import MediaError
from tritonllm.media.kinds import MAX_PARTS

# a part's type -> the media kind it carries (OpenAI's input_audio carries base64 audio with its format)
PART_KINDS = {
    "image_url": "image",
    "input_image": "image",
    "video_url": "video",
    "audio_url": "audio",
    "input_audio": "audio",
}
TEXT_TYPES = frozenset({"text", "input_text"})


@dataclass(frozen=True)
class MediaPart:
    kind: str  # image, video, audio
    reference: str  # a URL, a data URL, bare base64 or a server path
    where: str  # the part's place in the request, for errors
    # an image sent as its RGB pixels (TensorRT-LLM's image_bytes_input), not a file
    pixels: np.ndarray | None = field(default=None, compare=False)


def tensor_images(urls: list[str], pixels: np.ndarray | None) -> list[MediaPart]:
    """TensorRT-LLM's ensemble inputs: `image_url_input` (each a URL, a data URL or a server path) or
    `image_bytes_input` ([images, 3, H, W] or [images, H, W, 3] uint8 RGB pixels)."""
    media = [MediaPart("image", url, f"image_url_input[{i}]") for i, url in enumerate(urls)]
    if pixels is not None:
        for i, image in enumerate(pixels):
            where = f"image_bytes_input[{i}]"
            if image.ndim != 3 or 3 not in (image.shape[0], image.shape[-1]) or image.dtype != np.uint8:
                raise MediaError(where, f"{where} must be [3, H, W] or [H, W, 3] uint8 RGB pixels, got {image.shape}")
            media.append(MediaPart("image", "", where, image if image.shape[-1] == 3 else image.transpose(1, 2, 0)))
    if len(media) > MAX_PARTS:
        raise MediaError(
            media[MAX_PARTS].where, f"at most {MAX_PARTS} images in one request, this one has {len(media)}"
        )
    return media


def split_messages(messages: list, kinds: frozenset[str], where: str = "messages") -> tuple[list, list[MediaPart]]:
    """Messages with content parts -> (messages for the template, their media in order); `kinds`: what the model
    takes (a part of another kind is refused)."""
    rendered, media = [], []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            rendered.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            parts.append(_part(part, f"{where}[{i}].content[{j}]", kinds, media))
        rendered.append({**message, "content": parts})
    if len(media) > MAX_PARTS:
        raise MediaError(
            media[MAX_PARTS].where,
            f"{media[MAX_PARTS].where}: at most {MAX_PARTS} media parts in one request, this one has {len(media)}",
        )
    return rendered, media


def _part(part, where: str, kinds: frozenset[str], media: list[MediaPart]) -> dict:
    if not isinstance(part, dict):
        raise MediaError(where, f"{where} must be an object with a type")
    kind_name = part.get("type")
    if kind_name in TEXT_TYPES:
        text = part.get("text")
        if not isinstance(text, str):
            raise MediaError(f"{where}.text", f"{where}.text must be a string")
        return {"type": "text", "text": text}
    kind = PART_KINDS.get(kind_name)
    if kind is None:
        raise MediaError(
            f"{where}.type", f"{where}.type {kind_name!r} is not one of {sorted(TEXT_TYPES | set(PART_KINDS))}"
        )
    field = f"{where}.{kind_name}"
    if kind not in kinds:
        takes = ", ".join(sorted(kinds)) or "no media"
        raise MediaError(field, f"{field}: this model takes {takes}, not {kind}")
    media.append(MediaPart(kind, _reference(part, kind_name, field), field))
    return {"type": kind}


def _reference(part: dict, kind_name: str, field: str) -> str:
    """The pages' plain string (`"image_url": "/x.png"`), OpenAI's `{"url": ...}`, the Responses API's
    `image_url` string, or input_audio's `{"data": base64, "format": "wav"}`."""
    value = part.get(kind_name)
    if kind_name == "input_image":
        value = part.get("image_url")
    if kind_name == "input_audio" and isinstance(value, dict):
        data, form = value.get("data"), value.get("format")
        if not isinstance(data, str) or not isinstance(form, str):
            raise MediaError(field, f"{field} needs data (base64) and format (mp3, wav or flac)")
        return f"data:audio/{form};base64,{data}"
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise MediaError(field, f"{field} must be a URL string or an object with one (url)")
    return value
