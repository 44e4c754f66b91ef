"""Media parts loaded and decoded (tritonllm/media): every way a reference can point, every limit the API pages set,
and bad media refused as a MediaError (a 400) naming the part, never another exception. URLs are served from
loopback by a server of the test's own."""

from __future__ import annotations

import base64
import io
import math
import socket
import struct
import wave

import av
import numpy as np
import pytest
from loopback_site import Files, loopback_site
from PIL import Image

from tritonllm.media import decode
from tritonllm.media.errors import MediaError
from tritonllm.media.fetch import MediaPolicy, fetch
from tritonllm.media.kinds import AUDIO, IMAGE, MB, VIDEO

PART = "messages[0].content[1].image_url"


def png_bytes(size=(40, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 90)).save(out, format="PNG")
    return out.getvalue()


def jpeg_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), (10, 120, 240)).save(out, format="JPEG")
    return out.getvalue()


def wav_bytes(rate=8000, seconds=0.5) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        samples = [int(8000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(int(rate * seconds))]
        w.writeframes(struct.pack(f"<{len(samples)}h", *samples))
    return out.getvalue()


def encoded_audio(fmt: str, codec: str) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=16000, layout="mono")
        tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(tone[None, :], format="flt", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def mp4_bytes(frames=10) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(frames):
            picture = np.full((32, 32, 3), i * 20, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


class Routes(Files):
    """Redirect chains (/hop/N) and a body of no declared length (/endless) beside the fixed ones."""

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.startswith("/hop/"):
            left = int(self.path.rsplit("/", 1)[1])
            self.send_response(302)
            self.send_header("Location", f"/hop/{left - 1}" if left else "/image.png")
            self.end_headers()
            return
        if self.path == "/endless":  # no length declared: the limit holds while it downloads
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            chunk = b"\0" * MB
            try:
                for _ in range(25):
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        super().do_GET()


@pytest.fixture(scope="module")
def site():
    bodies = {
        "/image.png": ("image/png", png_bytes()),
        "/page.png": ("image/png", b"<!doctype html><html><body>not an image</body></html>"),
        "/big.png": ("image/png", b"\0" * (21 * MB)),
    }
    with loopback_site(bodies, Routes) as url:
        yield url


OPEN = MediaPolicy()  # URLs from any host, no server path


def load_image(reference: str, policy: MediaPolicy = OPEN):
    return decode.image(fetch(reference, IMAGE, PART, policy), PART)


def refused(call, *words: str) -> str:
    with pytest.raises(MediaError) as info:
        call()
    assert info.value.param == PART
    for word in words:
        assert word in info.value.message, info.value.message
    return info.value.message


def test_an_image_from_a_url_a_data_url_bare_base64_and_an_allowed_path(site, tmp_path):
    assert load_image(f"{site}/image.png").size == (40, 30)
    assert load_image("data:image/png;base64," + base64.b64encode(png_bytes()).decode()).size == (40, 30)
    assert load_image(base64.b64encode(jpeg_bytes()).decode()).size == (32, 32)  # the pages' base64 jpg
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "test.png").write_bytes(png_bytes((8, 9)))
    policy = MediaPolicy(allowed_local_path=tmp_path / "media")
    assert load_image(str(tmp_path / "media" / "test.png"), policy).size == (8, 9)  # the pages' "/xxxx/test.png"
    assert load_image(f"file://{tmp_path}/media/test.png", policy).mode == "RGB"


def test_server_paths_only_under_the_allowed_folder(tmp_path):
    (tmp_path / "media").mkdir()
    (tmp_path / "secret.png").write_bytes(png_bytes())
    (tmp_path / "media" / "link.png").symlink_to(tmp_path / "secret.png")
    refused(lambda: load_image(str(tmp_path / "secret.png")), "reads no server paths", "--allowed-local-media-path")
    policy = MediaPolicy(allowed_local_path=tmp_path / "media")
    refused(lambda: load_image(str(tmp_path / "secret.png"), policy), "no file")
    refused(lambda: load_image(str(tmp_path / "media" / ".." / "secret.png"), policy), "no file")
    refused(lambda: load_image(str(tmp_path / "media" / "link.png"), policy), "no file")  # a link out of it
    refused(lambda: load_image("/etc/passwd", policy), "no file")


def test_bad_images_are_refused_naming_the_part(site, tmp_path):
    refused(lambda: load_image(f"{site}/page.png"), "not a whole jpg, jpeg or png image")  # HTML served as PNG
    truncated = png_bytes((300, 300))[:200]
    refused(lambda: load_image("data:image/png;base64," + base64.b64encode(truncated).decode()), "not a whole")
    gif = io.BytesIO()
    Image.new("RGB", (4, 4)).save(gif, format="GIF")
    refused(lambda: load_image("data:image/gif;base64," + base64.b64encode(gif.getvalue()).decode()), "GIF")
    refused(lambda: load_image("data:image/png;base64,@@@not-base64@@@"), "does not decode")
    refused(lambda: load_image("data:image/png,plain"), "data:<type>;base64")
    refused(lambda: load_image("ftp://127.0.0.1/x.png"), "ftp")
    refused(lambda: load_image(""), "must be a URL")


def test_the_size_limits_hold_however_the_bytes_come(site, tmp_path):
    refused(lambda: load_image(f"{site}/big.png"), "20 MB")  # declared too large
    refused(lambda: load_image(f"{site}/endless"), "more than 20 MB")  # counted while it downloads
    big = "data:image/png;base64," + base64.b64encode(b"\0" * (21 * MB)).decode()
    refused(lambda: load_image(big), "20 MB")
    (tmp_path / "big.png").write_bytes(b"\0" * (21 * MB))
    refused(lambda: load_image(str(tmp_path / "big.png"), MediaPolicy(allowed_local_path=tmp_path)), "20 MB")
    assert AUDIO.max_bytes == 20 * MB and VIDEO.max_bytes == 512 * MB


def test_urls_are_bounded_by_hosts_redirects_and_reachability(site):
    assert load_image(f"{site}/hop/2").size == (40, 30)
    refused(lambda: load_image(f"{site}/hop/5"), "redirects more than 3")
    port = site.rsplit(":", 1)[1]
    only_localhost = MediaPolicy(allowed_domains=frozenset({"localhost"}))
    refused(lambda: load_image(f"{site}/image.png", only_localhost), "127.0.0.1 is not among")
    assert load_image(f"http://localhost:{port}/image.png", only_localhost).size == (40, 30)
    refused(lambda: load_image(f"{site}/missing.png"), "answered 404")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    refused(lambda: load_image(f"http://127.0.0.1:{closed}/image.png"), "could not be read")


@pytest.mark.parametrize(("fmt", "codec"), [("mp3", "libmp3lame"), ("flac", "flac")])
def test_audio_decodes_to_mono_samples_at_the_encoders_rate(fmt, codec):
    samples = decode.audio(encoded_audio(fmt, codec), PART)
    assert samples.dtype == np.float32 and 15000 <= len(samples) <= 17500
    assert 0.1 < np.abs(samples).max() <= 1.0


def test_a_wav_is_resampled_and_a_broken_one_refused():
    samples = decode.audio(wav_bytes(rate=8000, seconds=0.5), PART)
    assert abs(len(samples) - 8000) <= 64  # half a second at 16 kHz
    broken = bytearray(wav_bytes())
    broken[8:16] = b"XXXXXXXX"  # "WAVEfmt " smashed
    refused(lambda: decode.audio(bytes(broken), PART), "MP3, WAV or FLAC")
    refused(lambda: decode.audio(png_bytes(), PART), "MP3, WAV or FLAC")


def test_a_video_gives_frames_spread_over_it():
    frames = decode.video(mp4_bytes(10), PART, num_frames=4)
    assert len(frames) == 4 and frames[0].shape == (32, 32, 3)
    assert frames[0].mean() < frames[-1].mean()  # the first frame and the last, brightening
    refused(lambda: decode.video(wav_bytes(), PART, 4), "not MP4, AVI or WMV")
    refused(lambda: decode.video(mp4_bytes(10)[:300], PART, 4), "MP4, AVI or WMV")
