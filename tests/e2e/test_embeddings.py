"""/v1/embeddings through the real openai SDK and raw HTTP, against sentence-transformers on the same model."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from .conftest import EMBEDDING_MODEL, MODEL

INSTRUCTION = "Represent this sentence for searching relevant passages: "


def test_sdk_embeddings_equal_sentence_transformers(openai_client, sentence_model):
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'servers'}" for i in range(70)]  # two chunks
    response = openai_client.embeddings.create(model=EMBEDDING_MODEL, input=texts)  # the SDK asks for base64
    assert [d.index for d in response.data] == list(range(70))
    np.testing.assert_allclose([d.embedding for d in response.data], sentence_model.encode(texts), atol=2e-6)
    tokens = sum(len(ids) for ids in sentence_model.tokenizer(texts)["input_ids"])
    assert response.usage.prompt_tokens == response.usage.total_tokens == tokens
    assert response.model == EMBEDDING_MODEL


def test_float_response_has_the_spec_shape_and_instruction_applies(shim_url, sentence_model):
    body = {"model": EMBEDDING_MODEL, "input": "how do I run Triton?", "instruction": INSTRUCTION}
    r = httpx.post(f"{shim_url}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 200, r.text
    payload = r.json()
    assert payload["object"] == "list" and payload["model"] == EMBEDDING_MODEL and payload["id"]
    assert set(payload["usage"]) == {"prompt_tokens", "total_tokens"}  # no completion_tokens for embeddings
    [item] = payload["data"]
    assert item["object"] == "embedding" and item["index"] == 0 and len(item["embedding"]) == 384
    expected = sentence_model.encode([body["input"]], prompt=INSTRUCTION)[0]
    np.testing.assert_allclose(item["embedding"], expected, atol=2e-6)
    assert payload["usage"]["prompt_tokens"] == len(sentence_model.tokenizer(INSTRUCTION + body["input"])["input_ids"])


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"model": EMBEDDING_MODEL, "input": []}, 400, "input"),
        ({"model": EMBEDDING_MODEL, "input": ""}, 400, "input"),
        ({"model": EMBEDDING_MODEL, "input": ["ok", ""]}, 400, "input[1]"),
        ({"model": EMBEDDING_MODEL, "input": [[101, 102], []]}, 400, "input[1]"),
        ({"model": EMBEDDING_MODEL, "input": [[101, 102], [101, 30522]]}, 400, "input[1] holds ids outside"),
        ({"model": EMBEDDING_MODEL, "input": [101] * 257}, 400, "input[0] has 257 tokens"),
        ({"model": EMBEDDING_MODEL, "input": [101, 102], "instruction": "x"}, 400, "instruction"),
        ({"model": EMBEDDING_MODEL, "input": ["ok"] * 66 + ["word " * 300]}, 400, "input[66] has 302 tokens"),
        ({"model": EMBEDDING_MODEL, "input": "x", "dimensions": 128}, 400, "dimensions"),
        ({"model": EMBEDDING_MODEL, "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"model": MODEL, "input": "x"}, 400, "model"),
        ({"model": "nope", "input": "x"}, 404, "model"),
        ({"model": EMBEDDING_MODEL, "input": "x" * (4 * 1024 * 1024 + 1)}, 413, "input"),
    ],
)
def test_bad_embedding_requests_name_the_field(shim_url, body, status, field):
    r = httpx.post(f"{shim_url}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert field in r.json()["error"]["message"]


def test_token_ids_embed_as_the_text_they_tokenize_from(openai_client, shim_url, sentence_model):
    """OpenAI's int[] and int[][] inputs: the ids are read as they are (here the tokenizer's, special tokens
    included), so they embed as the text does; `model` left out is the embedding model, as in vLLM."""
    texts = ["how do I run Triton?", "a second, longer sentence about paged KV caches"]
    ids = sentence_model.tokenizer(texts)["input_ids"]
    expected = sentence_model.encode(texts)
    several = openai_client.embeddings.create(model=EMBEDDING_MODEL, input=ids, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in several.data], expected, atol=2e-6)
    assert several.usage.prompt_tokens == sum(map(len, ids))
    one = httpx.post(f"{shim_url}/v1/embeddings", json={"input": ids[1]}, timeout=60).json()
    assert one["model"] == EMBEDDING_MODEL
    np.testing.assert_allclose(one["data"][0]["embedding"], expected[1], atol=2e-6)


def test_chat_with_the_embedding_model_is_refused(openai_client):
    with pytest.raises(openai.BadRequestError, match="embeddings"):
        openai_client.chat.completions.create(model=EMBEDDING_MODEL, messages=[{"role": "user", "content": "x"}])
