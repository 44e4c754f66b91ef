"""The multimodal_encoders model's work without a server: requests queued together run the towers once where
their media stack, each getting its own rows (as encoded alone, to float tolerance: a batched matmul may round
differently); a request seen before is answered from the cache; M-RoPE positions are the model's own."""

from __future__ import annotations

import base64

import pytest
import torch
from conftest import MODELS, demo_model
from multimodal_models import build_multimodal, png

from tritonllm.media.fetch import MediaPolicy
from tritonllm.multimodal.content_parts import split_messages
from tritonllm.multimodal.encoder import MediaEncoder
from tritonllm.multimodal.prompt_builder import PromptBuilder


def prompt_inputs(builder: PromptBuilder, seeds: list[int]) -> dict:
    parts = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png(s)).decode()}}
        for s in seeds
    ]
    messages, media = split_messages(
        [{"role": "user", "content": [*parts, {"type": "text", "text": "hi"}]}], builder.kinds
    )
    render = lambda processor, c: processor.apply_chat_template(c, add_generation_prompt=True, tokenize=False)  # noqa: E731
    return builder.build(messages, media, render).encoder_inputs


@pytest.mark.parametrize("family", ["llava", "idefics3", "qwen2_vl"])
def test_queued_requests_run_the_towers_once(family, monkeypatch):
    folder = build_multimodal(family, demo_model("tiny"), MODELS / "multimodal")
    builder = PromptBuilder(folder, MediaPolicy())
    requests = [prompt_inputs(builder, seeds) for seeds in ([1], [2, 3], [4])]
    alone = [MediaEncoder(folder).embed(r) for r in requests]
    encoder = MediaEncoder(folder)
    calls = []
    features = encoder.model.get_image_features
    monkeypatch.setattr(encoder.model, "get_image_features", lambda **kw: calls.append(1) or features(**kw))
    together = encoder.embed_all(requests)
    assert len(calls) == 1
    for one, batched in zip(alone, together, strict=True):
        assert one.rows.shape == batched.rows.shape
        assert torch.allclose(one.rows, batched.rows, atol=1e-5)
        assert one.rope_delta == batched.rope_delta
        assert (one.rope_positions is None) == (batched.rope_positions is None)
        if one.rope_positions is not None:
            assert torch.equal(one.rope_positions, batched.rope_positions)
    assert encoder.embed_all(requests[:1])[0] is together[0]  # seen before: from the cache
    assert len(calls) == 1 and encoder.hits == 1
