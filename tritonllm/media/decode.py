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
from tritonllm.media.kinds import AUDIO, IMAGE, MAX_IMAGE_PIXELS, VIDEO, MediaKind

AUDIO_RATE = 16_000  # Whisper's, the audio encoders' rate
WHITE = (255, 255, 255, 255)
MAX_DECODED_FRAMES = 4096  # a video's frames decoded at most, before those kept are picked


def image(data: bytes, part: str, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """An RGB image, decoded whole, transparency laid over white: one with more than `max_pixels` pixels is refused
    from its header, before it is decoded; so is a truncated file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            picture = Image.open(io.BytesIO(data))
            if picture.format not in IMAGE.containers:
                raise MediaError(part, f"{part} is {picture.format}, not {IMAGE.described}")
            width, height = picture.size
            if width * height > max_pixels:
                raise MediaError(
                    part, f"{part} is {width} x {height} pixels; an image may have {max_pixels:,} pixels at most"
                )
            picture.load()
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise MediaError(part, f"{part} has too many pixels to decode ({e})") from e
    except Exception as e:  # Pillow's errors for unreadable data: UnidentifiedImageError, OSError, SyntaxError
        raise MediaError(part, f"{part} is not a whole {IMAGE.described} image ({type(e).__name__}: {e})") from e
    return _rgb(picture)


def _rgb(picture: Image.Image) -> Image.Image:
    """The decoded image (closed here) in RGB as transformers' image processors make it (`convert_to_rgb`), so that
    the model sees the pixels it would under generate(): an image with an alpha band or a transparent colour is laid
    over white (a bare `convert("RGB")` keeps whatever colour lies under its transparent pixels)."""
    if picture.mode == "RGB":
        return picture
    if "A" not in picture.getbands() and picture.info.get("transparency") is None:
        return picture.convert("RGB")
    with_alpha = picture.convert("RGBA")
    picture.close()  # each full-size copy is let go as soon as the next is made
    laid = Image.alpha_composite(Image.new("RGBA", with_alpha.size, WHITE), with_alpha)
    with_alpha.close()
    return laid.convert("RGB")


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
