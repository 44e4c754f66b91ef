"""Media in the prompt through the real tritonserver: the ensemble's chat with an image (or an audio clip) equals
transformers' generate() on the same pixels (or samples), token for token, for each multimodal family
(multimodal_models.py); two media under the same text never share KV blocks; a broken file is an error naming
its part."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import MODELS, PROJECT_ROOT, demo_model
from multimodal_models import (
    FAMILIES,
    IMAGE_FAMILIES,
    IMAGE_PLACEHOLDERS,
    Reference,
    Video,
    build_multimodal,
    mp4,
    png,
    transparent_png,
    wav,
)
from triton_helpers import Stream, tensor

from tritonllm.backend.model_parameters import MODEL_DIR_ENV
from tritonllm.launcher.tritonserver import TritonServer, free_ports

ENCODERS = PROJECT_ROOT / "optional_models" / "multimodal_encoders"
NEW_TOKENS = 8


def chat(family: str, medium: bytes, text: str = "what is this") -> list:
    encoded = base64.b64encode(medium).decode()
    if family in IMAGE_FAMILIES:
        part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}}
    else:
        part = {"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}}
    return [{"role": "user", "content": [part, {"type": "text", "text": text}]}]


def medium(family: str, seed: int) -> bytes:
    return png(seed) if family in IMAGE_FAMILIES else wav(seed)


@pytest.fixture(scope="module", params=FAMILIES)
def served(request, tmp_path_factory):
    model_dir = build_multimodal(request.param, demo_model("tiny"), MODELS / "multimodal")
    http, grpc, metrics = free_ports(3)
    server = TritonServer(
        PROJECT_ROOT / "model_repository",
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        env={MODEL_DIR_ENV: str(model_dir)},
        without_models=("embedding",),
        extra_models=(ENCODERS,),
        log_file=tmp_path_factory.mktemp("triton") / "tritonserver.log",
    )
    server.start(timeout=600)
    yield request.param, server
    server.stop()


@pytest.fixture(scope="module")
def reference(served):
    oracle = Reference(MODELS / "multimodal" / served[0])
    return lambda image, text="what is this": oracle.ids([image, text], NEW_TOKENS)


def ask(server, messages: list) -> list[int]:
    stream = Stream(server.grpc_url)
    try:
        stream.send(
            "ensemble",
            [
                tensor("chat_messages", [[json.dumps(messages)]], "BYTES"),
                tensor("max_tokens", [[NEW_TOKENS]], "INT32"),
                tensor("stream", [[True]], "BOOL"),
            ],
        )
        return [int(t) for r in stream.until_final(timeout=120) for t in r.as_numpy("output_ids").reshape(-1)]
    finally:
        stream.close()


def test_chat_with_media_equals_transformers(served, reference):
    family, server = served
    clip = medium(family, 0)
    assert ask(server, chat(family, clip)) == reference(clip)


def test_a_video_with_an_image_equals_transformers(served, reference):
    """Qwen2-VL's video path: two frames a temporal patch, M-RoPE's temporal positions; the video's rows after
    the image's though the video comes first in the prompt."""
    family, server = served
    if family != "qwen2_vl":
        pytest.skip(f"{family} takes no video")  # the one video family here
    clip, image = mp4(0), png(5)
    parts = [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(clip).decode()}},
        {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()}},
    ]
    expected = Reference(MODELS / "multimodal" / family).ids([Video(clip), "and", image], NEW_TOKENS)
    assert ask(server, [{"role": "user", "content": parts}]) == expected


def test_same_text_other_media_shares_no_blocks(served, reference):
    """The second request's prompt ids equal the first's (the media tokens are row places); only the rows'
    digests in the blocks' names keep it from reusing the first medium's KV."""
    family, server = served
    first, second = medium(family, 1), medium(family, 2)
    assert ask(server, chat(family, first)) == reference(first)
    assert ask(server, chat(family, second)) == reference(second)
    assert ask(server, chat(family, first)) == reference(first)  # and the first again, from its cached blocks


@pytest.mark.parametrize("given", ["image_url_input", "image_bytes_input"])
def test_tensorrt_llm_image_inputs_beside_a_text_input(served, given):
    """TensorRT-LLM's multimodal ensemble inputs: the prompt as the client writes it, placeholders in it."""
    import io

    from PIL import Image

    family, server = served
    if family not in IMAGE_FAMILIES:
        pytest.skip(f"{family} takes no images")
    image = png(30)
    prompt = f"USER: {IMAGE_PLACEHOLDERS[family]}what is this\nASSISTANT:"
    if given == "image_url_input":
        media = tensor(given, [["data:image/png;base64," + base64.b64encode(image).decode()]], "BYTES")
    else:
        pixels = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))[None, None]  # [batch, images, H, W, 3]
        media = grpcclient.InferInput(given, list(pixels.shape), "UINT8")
        media.set_data_from_numpy(pixels)
    stream = Stream(server.grpc_url)
    try:
        stream.send(
            "ensemble",
            [
                tensor("text_input", [[prompt]], "BYTES"),
                media,
                tensor("max_tokens", [[NEW_TOKENS]], "INT32"),
                tensor("stream", [[True]], "BOOL"),
            ],
        )
        got = [int(t) for r in stream.until_final(timeout=120) for t in r.as_numpy("output_ids").reshape(-1)]
    finally:
        stream.close()
    assert got == Reference(MODELS / "multimodal" / family).raw_ids(prompt, [image], NEW_TOKENS)


def test_concurrent_requests_each_get_their_own_media(served, reference):
    """Sent at once, the requests' media may be encoded together (multimodal_encoders' dynamic batching); each
    answer is still its own medium's."""
    family, server = served
    clips = [medium(family, seed) for seed in range(20, 24)]
    with ThreadPoolExecutor(len(clips)) as pool:
        answers = list(pool.map(lambda clip: ask(server, chat(family, clip)), clips))
    assert answers == [reference(clip) for clip in clips]


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_a_transparent_image_is_laid_over_white_as_transformers_lays_it(served, reference, mode):
    family, server = served
    if family not in IMAGE_FAMILIES:
        pytest.skip("an audio model takes no image")
    picture = transparent_png(30, mode)
    assert ask(server, chat(family, picture)) == reference(picture)


def test_a_truncated_file_is_an_error_naming_its_part(served, reference):
    family, server = served
    broken = medium(family, 3)[:30]  # a PNG's signature and part of its header; a WAV's header cut short
    part = "image_url" if family in IMAGE_FAMILIES else "input_audio"
    with pytest.raises(Exception, match=rf"messages\[0\]\.content\[0\]\.{part}"):
        ask(server, chat(family, broken))
    clip = medium(family, 4)
    assert ask(server, chat(family, clip)) == reference(clip)  # still serving
