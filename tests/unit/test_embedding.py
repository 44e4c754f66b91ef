"""SentenceEmbedder against the model card's own recipe: BERT, mean pooling over the mask, L2 normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tritonllm.embedding import InputTooLong, SentenceEmbedder, embedding_model_dir

TEXTS = ["hello world", "A longer sentence, with punctuation and Ünïcödé.", ""]


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder()


def model_card_embeddings(texts: list[str]) -> np.ndarray:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedding_model_dir())
    model = AutoModel.from_pretrained(embedding_model_dir()).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


def test_vectors_equal_the_model_card_recipe(embedder):
    texts, counts = embedder.prepare(TEXTS)
    vectors = embedder.encode(texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, model_card_embeddings(TEXTS), atol=2e-6)
    assert counts == [len(ids) for ids in embedder.model.tokenizer(TEXTS)["input_ids"]]
    assert counts[2] == 2  # [CLS] [SEP]


def test_instruction_goes_in_front_as_sentence_transformers_prompt(embedder):
    instruction = "Represent this sentence for searching relevant passages: "
    texts, counts = embedder.prepare(TEXTS[:2], [instruction] * 2)
    expected = embedder.model.encode(TEXTS[:2], prompt=instruction)
    np.testing.assert_allclose(embedder.encode(texts), expected, atol=2e-6)
    assert counts == embedder.count_tokens([instruction + t for t in TEXTS[:2]])
    assert not np.allclose(embedder.encode(texts), embedder.encode(TEXTS[:2]), atol=1e-3)


def test_a_text_over_the_limit_is_refused_with_its_row(embedder):
    assert embedder.max_tokens == 256
    with pytest.raises(InputTooLong, match=r"text_input\[1\] has 302 tokens, more than the embedding model's 256"):
        embedder.prepare(["short", "word " * 300])
    embedder.prepare(["word " * 254])  # 254 + [CLS] + [SEP] fits exactly
