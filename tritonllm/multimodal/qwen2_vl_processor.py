"""Qwen2-VL's (and Qwen2.5-VL's) processor without torchvision: transformers' own processor class, its PIL
image processor, and in place of its video processor (torchvision's, which does not load with this torch) one
that makes each video's patches from its frames as the image processor makes an image's: every frame resized,
rescaled and normalized as a picture is, then each pair of frames one temporal patch (an image is one frame
given twice)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class FramePairs:
    """Videos (each a list of RGB frames) -> `pixel_values_videos` and `video_grid_thw`, Qwen2-VL's layout."""

    def __init__(self, images) -> None:
        self.images = images
        self.merge_size = images.merge_size
        self.temporal_patch_size = images.temporal_patch_size

    def __call__(self, videos, **_) -> dict[str, np.ndarray]:
        patches, grids = [], []
        for frames in videos:
            frames = list(frames)
            frames += frames[-1:] * (-len(frames) % self.temporal_patch_size)
            each = [self.images.preprocess([frame], return_tensors="np") for frame in frames]
            grid = each[0]["image_grid_thw"][0]
            # a frame's patches: [patches, channels, temporal, patch, patch]; the frame given once per slice
            shape = (grid[1] * grid[2], -1, self.temporal_patch_size, self.images.patch_size, self.images.patch_size)
            for start in range(0, len(frames), self.temporal_patch_size):
                group = [each[start + t]["pixel_values"].reshape(shape) for t in range(self.temporal_patch_size)]
                joined = np.stack([g[:, :, t] for t, g in enumerate(group)], axis=2)
                patches.append(joined.reshape(joined.shape[0], -1))
            grids.append([len(frames) // self.temporal_patch_size, grid[1], grid[2]])
        return {"pixel_values_videos": np.concatenate(patches), "video_grid_thw": np.array(grids, dtype=np.int64)}


def load(model_dir: Path, family: str = "qwen2_vl"):
    """The folder's Qwen2VLProcessor (Qwen2_5_VLProcessor for Qwen2.5-VL), its videos made by FramePairs."""
    import transformers  # noqa: PLC0415 - a Qwen2-VL model's only
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: PLC0415

    processor_class = transformers.Qwen2_5_VLProcessor if family == "qwen2_5_vl" else transformers.Qwen2VLProcessor

    class Processor(processor_class):
        def check_argument_for_proper_class(self, name, argument):
            return (
                type(argument) if name == "video_processor" else super().check_argument_for_proper_class(name, argument)
            )

    images = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    template = Path(model_dir) / "chat_template.jinja"
    chat_template = template.read_text() if template.exists() else tokenizer.chat_template
    return Processor(images, tokenizer, FramePairs(images), chat_template=chat_template)
