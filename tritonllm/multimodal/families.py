"""What differs between the multimodal families served: the config key naming each medium's placeholder token,
the submodule holding the language model (which the encoders drop), and how the towers take their inputs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    placeholder_keys: tuple[str, ...]  # config.json keys whose value is a placeholder token's id
    language_module: str  # the attribute of the inner model that holds the language model
    # the inner model's method that turns encoder inputs into embedding rows; MERGED: none, so the rows are the
    # embeddings its own forward pass merges in (the language model replaced by one that keeps what it is given)
    features: str
    loader: str = "AutoModelForImageTextToText"  # transformers' class that loads the whole model
    batched_images: bool = False  # the tower takes pixel_values as [1, crops, 3, H, W], not [images, 3, H, W]


FAMILIES = {
    "llava": Family(("image_token_index", "image_token_id"), "language_model", "get_image_features"),
    "idefics3": Family(("image_token_id",), "text_model", "get_image_features", batched_images=True),
    "smolvlm": Family(("image_token_id",), "text_model", "get_image_features", batched_images=True),
    "qwen2_audio": Family(
        ("audio_token_index", "audio_token_id"), "language_model", "merged", "Qwen2AudioForConditionalGeneration"
    ),
}

# the processor's outputs the encoders take, each with the dtype and rank it travels in (a leading batch of one
# dropped, as Triton's inputs have a fixed rank)
ENCODER_INPUTS = {
    "pixel_values": ("float32", 4),
    "pixel_attention_mask": ("bool", 3),
    "input_features": ("float32", 3),
    "feature_attention_mask": ("int32", 2),
    "media_tokens": ("int32", 1),  # the prompt's media tokens: the rows a merged forward pass is asked for
}
MERGED = "merged"


def placeholder_ids(config: dict, family: Family) -> frozenset[int]:
    return frozenset(int(config[key]) for key in family.placeholder_keys if config.get(key) is not None)
