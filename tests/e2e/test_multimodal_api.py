"""Images through `tritonllm serve` and its HTTP face, as a user sends them: the openai SDK with a base64 image
and with a URL served from loopback, the pages' generate_stream example (a list text_input naming a server
file), /v1/models' modalities; each answer equal to transformers' generate() on the same picture. Bad media are
400s naming the part, and the server keeps serving after each."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import psutil
import pytest
from conftest import MODELS, demo_model
from loopback_site import loopback_site
from multimodal_models import Reference, build_multimodal, png, wav
from PIL import Image

from e2e.conftest import running_serve
from tritonllm.launcher.tritonserver import free_port
from tritonllm.media.kinds import MAX_PARTS

TOKENS = 8
QUESTION = "what is this"


@pytest.fixture(scope="module")
def media_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    (folder / "test.png").write_bytes(png(5))
    (folder / "large.png").write_bytes(png(6) + b"\0" * (21 << 20))  # over the pages' 20 MB
    return folder


@pytest.fixture(scope="module")
def model_dir():
    return build_multimodal("llava", demo_model("tiny"), MODELS / "multimodal")


@pytest.fixture(scope="module")
def reference(model_dir):
    return Reference(model_dir)


@pytest.fixture(scope="module")
def serve(model_dir, media_folder, tmp_path_factory):
    flags = ("--no-embedding", "--allowed-local-media-path", str(media_folder))
    with running_serve(model_dir, tmp_path_factory.mktemp("serve"), *flags) as ports:
        yield f"http://127.0.0.1:{ports['--shim-port']}"


@pytest.fixture(scope="module")
def loopback_files():
    """/picture.png is a PNG, /page.png an HTML page under an image's name."""
    pages = {"/picture.png": ("image/png", png(7)), "/page.png": ("image/png", b"<html><body>hello</body></html>")}
    with loopback_site(pages) as url:
        yield url


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def image_chat(url: str) -> list:
    return [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}],
        }
    ]


def test_openai_sdk_sends_a_base64_image(serve, reference):
    import openai

    client = openai.OpenAI(base_url=f"{serve}/v1", api_key="none")
    image = png(0)
    whole = client.chat.completions.create(
        model="llava", messages=image_chat(data_url(image)), max_tokens=TOKENS, temperature=0
    )
    assert whole.choices[0].message.content == reference.text([image, QUESTION], TOKENS)
    streamed = client.chat.completions.create(
        model="llava", messages=image_chat(data_url(image)), max_tokens=TOKENS, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == whole.choices[0].message.content
    assert whole.usage.prompt_tokens > 16  # the image's 16 tokens are prompt tokens


def test_anthropic_sdk_sends_an_image_by_base64_and_by_url(serve, reference, loopback_files):
    import anthropic

    client = anthropic.Anthropic(base_url=serve, api_key="none", max_retries=0)
    image = png(0)
    sources = [
        ({"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}, image),
        ({"type": "url", "url": f"{loopback_files}/picture.png"}, png(7)),
    ]
    for source, pixels in sources:
        content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
        message = client.messages.create(
            model="llava",
            max_tokens=TOKENS,
            messages=[{"role": "user", "content": content}],
            extra_body={"temperature": 0},
        )
        assert message.content[0].text == reference.text([pixels, QUESTION], TOKENS)
        assert message.usage.input_tokens > 16  # the image's 16 tokens are prompt tokens


def test_openai_sdk_sends_an_image_url(serve, reference, loopback_files):
    import openai

    client = openai.OpenAI(base_url=f"{serve}/v1", api_key="none")
    answer = client.chat.completions.create(
        model="llava", messages=image_chat(f"{loopback_files}/picture.png"), max_tokens=TOKENS, temperature=0
    )
    assert answer.choices[0].message.content == reference.text([png(7), QUESTION], TOKENS)


def test_responses_api_takes_an_input_image(serve, reference):
    import openai

    client = openai.OpenAI(base_url=f"{serve}/v1", api_key="none")
    image = png(10)
    content = [{"type": "input_image", "image_url": data_url(image)}, {"type": "input_text", "text": QUESTION}]
    response = client.responses.create(
        model="llava", input=[{"role": "user", "content": content}], max_output_tokens=TOKENS, temperature=0
    )
    assert response.output_text == reference.text([image, QUESTION], TOKENS)


def test_the_pages_generate_stream_example(serve, reference, media_folder):
    body = {
        "id": "a123",
        "text_input": [
            {"type": "text", "text": "My name is Olivier and I"},
            {"type": "image_url", "image_url": str(media_folder / "test.png")},
        ],
        "parameters": {"max_new_tokens": TOKENS, "details": True},
    }
    with httpx.stream("POST", f"{serve}/v2/models/llava/generate_stream", json=body, timeout=60) as response:
        assert response.status_code == 200
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    assert "".join(e["text_output"] for e in events) == reference.text(["My name is Olivier and I", png(5)], TOKENS)


@pytest.mark.parametrize("route", ["generate_stream", "generate"])
def test_a_bad_image_in_a_list_text_input_is_named_as_sent(serve, route):
    body = {
        "text_input": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": data_url(png(3)[:200])}],
        "parameters": {"max_new_tokens": 2},
    }
    response = httpx.post(f"{serve}/v2/models/llava/{route}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert "text_input[1]" in response.text and "messages[" not in response.text, response.text


def _stub_of(shim_url: str, model: str) -> psutil.Process:
    """The Python stub of `model` in the server whose shim listens at `shim_url`."""
    port = int(shim_url.rsplit(":", 1)[1])
    (serve,) = {c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN"}
    stubs = [p for p in psutil.Process(serve).children(recursive=True) if f"{model}_0_0" in " ".join(p.cmdline())]
    assert len(stubs) == 1, stubs
    return stubs[0]


def _peak_rss_mb(process: psutil.Process) -> float:
    status = Path(f"/proc/{process.pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def test_a_pixel_bomb_is_refused_from_its_header_before_it_is_decoded(serve, reference):
    """9000 x 9000 grey pixels compress to some 80 KB of PNG, under Pillow's own bound; decoded they are 81 MB, and
    243 MB in RGB. Refused from the header, the preprocessing stub's peak memory does not move by a decode's worth."""
    bomb = io.BytesIO()
    Image.new("L", (9000, 9000), 128).save(bomb, "PNG")
    preprocessing = _stub_of(serve, "preprocessing")
    before = _peak_rss_mb(preprocessing)
    body = {"model": "llava", "messages": image_chat(data_url(bomb.getvalue())), "max_tokens": 2}
    response = httpx.post(f"{serve}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "messages[0].content[0].image_url is 9000 x 9000 pixels" in message, message
    assert _peak_rss_mb(preprocessing) - before < 40
    image = png(9)
    body = {"model": "llava", "messages": image_chat(data_url(image)), "max_tokens": TOKENS, "temperature": 0}
    after = httpx.post(f"{serve}/v1/chat/completions", json=body, timeout=60).json()
    assert after["choices"][0]["message"]["content"] == reference.text([image, QUESTION], TOKENS)


def test_models_say_what_they_take(serve):
    card = httpx.get(f"{serve}/v1/models/llava").json()
    assert card["input_modalities"] == ["text", "image"]


def _parts(url: str, count: int = 1) -> list:
    return [{"type": "image_url", "image_url": {"url": url}} for _ in range(count)] + [{"type": "text", "text": "hi"}]


@pytest.mark.parametrize(
    "case",
    ["truncated png", "21 MB image", "21st media part", "path outside the folder", "unreachable URL", "HTML page"],
)
def test_bad_media_is_a_400_naming_the_part(serve, reference, media_folder, loopback_files, tmp_path, case):
    outside = tmp_path / "outside.png"
    outside.write_bytes(png(8))
    where = "messages[0].content[0].image_url"
    content = {
        "truncated png": _parts(data_url(png(3)[:200])),
        "21 MB image": _parts(str(media_folder / "large.png")),
        "21st media part": _parts(data_url(png(3)), MAX_PARTS + 1),
        "path outside the folder": _parts(str(outside)),
        "unreachable URL": _parts(f"http://127.0.0.1:{free_port()}/x.png"),
        "HTML page": _parts(f"{loopback_files}/page.png"),
    }[case]
    if case == "21st media part":
        where = f"messages[0].content[{MAX_PARTS}].image_url"
    body = {"model": "llava", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    response = httpx.post(f"{serve}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert where in response.json()["error"]["message"]
    image = png(9)
    body = {"model": "llava", "messages": image_chat(data_url(image)), "max_tokens": TOKENS, "temperature": 0}
    after = httpx.post(f"{serve}/v1/chat/completions", json=body, timeout=60).json()
    assert after["choices"][0]["message"]["content"] == reference.text([image, QUESTION], TOKENS)


@pytest.fixture(scope="module")
def audio_serve(tmp_path_factory):
    folder = build_multimodal("qwen2_audio", demo_model("tiny"), MODELS / "multimodal")
    with running_serve(folder, tmp_path_factory.mktemp("serve-audio"), "--no-embedding") as ports:
        yield folder, f"http://127.0.0.1:{ports['--shim-port']}"


def test_openai_sdk_sends_an_audio_clip(audio_serve):
    import openai

    folder, url = audio_serve
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    clip = wav(1)
    content = [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip).decode(), "format": "wav"}},
        {"type": "text", "text": QUESTION},
    ]
    answer = client.chat.completions.create(
        model="qwen2_audio", messages=[{"role": "user", "content": content}], max_tokens=TOKENS, temperature=0
    )
    assert answer.choices[0].message.content == Reference(folder).text([clip, QUESTION], TOKENS)
    assert httpx.get(f"{url}/v1/models/qwen2_audio").json()["input_modalities"] == ["text", "audio"]


def test_a_wav_with_a_broken_header_is_a_400_naming_the_part(audio_serve):
    _, url = audio_serve
    broken = bytearray(wav(2))
    broken[8:12] = b"JUNK"  # RIFF's format field: no longer WAVE
    content = [
        {"type": "text", "text": QUESTION},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(bytes(broken)).decode(), "format": "wav"}},
    ]
    body = {"model": "qwen2_audio", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert "messages[0].content[1].input_audio" in response.json()["error"]["message"]
