"""The media a prompt may carry, with the API pages' limits: images (jpg, jpeg, png; at most 20 MB), videos (MP4,
AVI, WMV; at most 512 MB), audio (MP3, WAV, FLAC; at most 20 MB), at most 20 media parts in one chat request and
one image in a generate_stream request (../shared/specs/chat-completions.md, generate_stream.md)."""

from __future__ import annotations

from dataclasses import dataclass

MB = 1 << 20
MAX_PARTS = 20  # image, video and audio parts of one chat request together
# An image's pixels at most, checked from its header before it is decoded: an 8K frame (7680 x 4320). Pillow's own
# bound (89 million, an error only past twice that) lets a 236 KB PNG of 9000 x 9000 decode into 1.2 GB.
MAX_IMAGE_PIXELS = 7680 * 4320
MAX_GENERATE_STREAM_IMAGES = 1


@dataclass(frozen=True)
class MediaKind:
    name: str  # image, video, audio
    max_bytes: int
    containers: frozenset[str]  # what the decoder may find the bytes to be (Pillow's formats, FFmpeg's demuxers)
    described: str  # the formats as the pages name them, for errors


IMAGE = MediaKind("image", 20 * MB, frozenset({"JPEG", "PNG"}), "jpg, jpeg or png")
VIDEO = MediaKind(
    "video", 512 * MB, frozenset({"mov", "mp4", "m4a", "3gp", "3g2", "mj2", "avi", "asf"}), "MP4, AVI or WMV"
)
AUDIO = MediaKind("audio", 20 * MB, frozenset({"mp3", "wav", "flac"}), "MP3, WAV or FLAC")
KINDS = {kind.name: kind for kind in (IMAGE, VIDEO, AUDIO)}
