"""A multimodal folder's parts and a chat's content parts, without a server: which families are served (the rest
refused by name), the language model split out under a causal LM's names, and each media part's reference and
errors, named where the part sits."""

from __future__ import annotations

import json

import pytest
from conftest import MODELS, demo_model
from multimodal_models import build_multimodal

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.formats import multimodal_folder
from tritonllm.media.errors import MediaError
from tritonllm.media.kinds import MAX_PARTS
from tritonllm.multimodal.content_parts import MediaPart, split_messages

IMAGE = frozenset({"image"})


def test_a_text_folder_is_its_own_language_model():
    tiny = demo_model("tiny")
    assert multimodal_folder.language_model_dir(tiny) == tiny
    assert multimodal_folder.media_kinds(tiny) == frozenset()


def test_the_language_model_is_split_out_under_a_causal_lms_names():
    import torch
    import transformers

    folder = build_multimodal("llava", demo_model("tiny"), MODELS / "multimodal")
    text = multimodal_folder.language_model_dir(folder)
    assert json.loads((text / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    whole = transformers.AutoModelForImageTextToText.from_pretrained(folder).eval()
    alone = transformers.AutoModelForCausalLM.from_pretrained(text).eval()
    ids = torch.tensor([[1, 50, 60, 70]])
    assert torch.equal(whole(input_ids=ids).logits, alone(input_ids=ids).logits)


def test_m_rope_sections_move_out_of_the_rope_parameters():
    folder = build_multimodal("qwen2_vl", demo_model("tiny"), MODELS / "multimodal")
    text = json.loads((multimodal_folder.language_model_dir(folder) / "config.json").read_text())
    assert (text["architectures"], text["model_type"]) == (["Qwen2ForCausalLM"], "qwen2")
    assert text["mrope_section"] == [2, 3, 3]
    assert text["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}


def test_a_family_without_an_encoder_is_refused_by_name(tmp_path):
    config = {
        "model_type": "mllama",
        "vision_config": {"num_hidden_layers": 2},
        "text_config": {"model_type": "mllama_text_model"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="mllama is a multimodal family"):
        multimodal_folder.language_model_dir(tmp_path)
    config = {
        "model_type": "smolvlm",
        "vision_config": {"num_hidden_layers": 2},
        "text_config": {"model_type": "llama"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="smolvlm: SmolVLM2's processor needs transformers' video"):
        multimodal_folder.language_model_dir(tmp_path)


def test_parts_become_placeholders_and_references_in_order():
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "compare"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "image_url", "image_url": "/srv/b.png"},  # the pages' plain string
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            ],
        },
    ]
    rendered, media = split_messages(messages, frozenset({"image", "audio"}))
    assert rendered[0] == messages[0]
    assert rendered[1]["content"] == [
        {"type": "text", "text": "compare"},
        {"type": "image"},
        {"type": "image"},
        {"type": "audio"},
    ]
    assert media == [
        MediaPart("image", "https://example.com/a.png", "messages[1].content[1].image_url"),
        MediaPart("image", "/srv/b.png", "messages[1].content[2].image_url"),
        MediaPart("audio", "data:audio/wav;base64,UklGRg==", "messages[1].content[3].input_audio"),
    ]


@pytest.mark.parametrize(
    ("part", "where"),
    [
        ({"type": "audio_url", "audio_url": {"url": "x.wav"}}, "messages[0].content[0].audio_url"),  # not taken
        ({"type": "image_url", "image_url": {}}, "messages[0].content[0].image_url"),
        ({"type": "picture"}, "messages[0].content[0].type"),
        ({"type": "text", "text": 5}, "messages[0].content[0].text"),
    ],
)
def test_a_bad_part_is_named(part, where):
    with pytest.raises(MediaError) as error:
        split_messages([{"role": "user", "content": [part]}], IMAGE)
    assert error.value.param == where


def test_one_media_part_too_many_is_named():
    parts = [{"type": "image_url", "image_url": {"url": "data:,"}}] * (MAX_PARTS + 1)
    with pytest.raises(MediaError) as error:
        split_messages([{"role": "user", "content": parts}], IMAGE)
    assert error.value.param == f"messages[0].content[{MAX_PARTS}].image_url"
