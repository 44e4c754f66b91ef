"""Media bytes decoded by maintained libraries: images by Pillow, audio and video by PyAV (FFmpeg, bundled in its
wheel). What does not decode whole, or decodes to a format the pages do not take, is a MediaError naming the part;
the decoders' own exceptions never leave here."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import av
import numpy as np
from PIL import Image

from tritonllm.media.errors import MediaError
from tritonllm.media.kinds import AUDIO, IMAGE, VIDEO, MediaKind

AUDIO_RATE = 16_000  # Whisper's, the audio encoders' rate
MAX_DECODED_FRAMES = 4096  # a video's frames decoded at most, before those kept are picked


def image(data: bytes, part: str) -> Image.Image:
    """An RGB image, decoded whole: a truncated file or one that would decode past Pillow's pixel bound is refused."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            picture = Image.open(io.BytesIO(data))
            if picture.format not in IMAGE.containers:
                raise MediaError(part, f"{part} is {picture.format}, not {IMAGE.described}")
            picture.load()
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise MediaError(part, f"{part} has too many pixels to decode ({e})") from e
    except Exception as e:  # Pillow's errors for unreadable data: UnidentifiedImageError, OSError, SyntaxError
        raise MediaError(part, f"{part} is not a whole {IMAGE.described} image ({type(e).__name__}: {e})") from e
    return picture.convert("RGB")


def audio(data: bytes, part: str, rate: int = AUDIO_RATE) -> np.ndarray:
    """float32 mono samples at `rate`, the whole clip."""
    with _decoding(data, part, AUDIO) as container:
        if not container.streams.audio:
            raise MediaError(part, f"{part} holds no audio")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        chunks = []
        for frame in container.decode(audio=0):
            chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
        chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    if not samples.size:
        raise MediaError(part, f"{part} holds no audio samples")
    return samples.astype(np.float32, copy=False)


def video(data: bytes, part: str, num_frames: int) -> list[np.ndarray]:
    """`num_frames` RGB frames [height, width, 3] spread evenly over the video (all of them when it has fewer)."""
    with _decoding(data, part, VIDEO) as container:
        if not container.streams.video:
            raise MediaError(part, f"{part} holds no video")
        frames = []
        for frame in container.decode(video=0):
            frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) > MAX_DECODED_FRAMES:
                raise MediaError(part, f"{part} has more than {MAX_DECODED_FRAMES} frames")
    if not frames:
        raise MediaError(part, f"{part} holds no frames")
    picks = np.linspace(0, len(frames) - 1, min(num_frames, len(frames))).round().astype(int)
    return [frames[i] for i in picks]


@contextmanager
def _decoding(data: bytes, part: str, kind: MediaKind) -> Iterator[av.container.InputContainer]:
    """The bytes opened as a container of one of `kind`'s formats, closed after; FFmpeg's errors while opening or
    decoding become MediaErrors naming the part."""
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError) as e:
        raise MediaError(part, f"{part} is not {kind.described} ({e})") from e
    try:
        if not set(container.format.name.split(",")) & kind.containers:
            raise MediaError(part, f"{part} is {container.format.name}, not {kind.described}")
        yield container
    except MediaError:
        raise
    except (av.FFmpegError, ValueError) as e:
        raise MediaError(part, f"{part} does not decode as {kind.described} ({e})") from e
    finally:
        container.close()
