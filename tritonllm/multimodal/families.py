"""What differs between the multimodal families served: the config keys naming each medium's placeholder token,
the submodule holding the language model (which the encoders drop), and how the towers take their inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

MERGED = "merged"


@dataclass(frozen=True)
class Family:
    # each medium's placeholder token, by the config.json keys that may hold its id; the media's rows come in this
    # order (all of the images' rows, then the videos'), as the model merges them in one kind after the other
    placeholder_keys: dict[str, tuple[str, ...]]
    language_module: str  # the attribute of the inner model that holds the language model
    # each medium's method of the inner model that turns encoder inputs into embedding rows; MERGED: none, so the
    # rows are the embeddings its own forward pass merges in (the language model replaced by one that keeps them)
    features: dict[str, str]
    loader: str = "AutoModelForImageTextToText"  # transformers' class that loads the whole model
    batched_images: bool = False  # the tower takes pixel_values as [1, crops, 3, H, W], not [images, 3, H, W]
    # the processor's output names the encoders take under another (Triton's inputs have one rank a name)
    renamed: dict[str, str] = field(default_factory=dict)
    mrope: bool = False  # the language model's rotary positions are M-RoPE's, which the encoders compute


_IMAGE = {"image": ("image_token_index", "image_token_id")}
_QWEN_VL = Family(
    {"image": ("image_token_id",), "video": ("video_token_id",)},
    "language_model",
    {"image": "get_image_features", "video": "get_video_features"},
    renamed={"pixel_values": "pixel_patches", "pixel_values_videos": "video_patches"},
    mrope=True,
)
_IMAGE_FEATURES = {"image": "get_image_features"}
FAMILIES = {
    "llava": Family(_IMAGE, "language_model", _IMAGE_FEATURES),
    "idefics3": Family(_IMAGE, "text_model", _IMAGE_FEATURES, batched_images=True),
    "qwen2_audio": Family(
        {"audio": ("audio_token_index", "audio_token_id")},
        "language_model",
        {"audio": MERGED},
        "Qwen2AudioForConditionalGeneration",
    ),
    "qwen2_vl": _QWEN_VL,
    "qwen2_5_vl": _QWEN_VL,
}

# what the encoders take (the processor's outputs, under their names in `renamed`), each with the dtype and rank
# it travels in (a leading batch of one dropped, as Triton's inputs have a fixed rank)
ENCODER_INPUTS = {
    "pixel_values": ("float32", 4),
    "pixel_attention_mask": ("bool", 3),
    "pixel_patches": ("float32", 2),  # Qwen2-VL's flattened patches
    "image_grid_thw": ("int64", 2),
    "video_patches": ("float32", 2),
    "video_grid_thw": ("int64", 2),
    "input_features": ("float32", 3),
    "feature_attention_mask": ("int32", 2),
    "media_tokens": ("int32", 1),  # the prompt's media tokens: the rows a merged forward pass is asked for
    # M-RoPE's positions are computed from the prompt: its ids (placeholders as the processor wrote them) and
    # which medium each token is (0 text, 1 image, 2 video)
    "input_ids": ("int64", 1),
    "mm_token_type_ids": ("int32", 1),
}
# the inputs a medium's features method takes, by the processor's names
FEATURE_INPUTS = {
    "image": ("pixel_values", "pixel_attention_mask", "image_grid_thw"),
    "video": ("pixel_values_videos", "video_grid_thw"),
    "audio": ("input_features", "feature_attention_mask"),
}


def placeholder_ids(config: dict, family: Family) -> dict[str, int]:
    """Each medium's placeholder token id."""
    found = {}
    for kind, keys in family.placeholder_keys.items():
        ids = [int(config[key]) for key in keys if config.get(key) is not None]
        if ids:
            found[kind] = ids[0]
    return found
