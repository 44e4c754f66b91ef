"""SentenceEmbedder against sentence-transformers' encode and the model card's own recipe (BERT, mean pooling over
the mask, L2 normalisation), other pooling modes against sentence-transformers, other pipelines refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from tritonllm.backend.embedding import InputTooLong, SentenceEmbedder, UnsupportedEmbeddingModel, embedding_model_dir

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
    assert counts == [len(ids) for ids in embedder.tokenizer(TEXTS)["input_ids"]]
    assert counts[2] == 2  # [CLS] [SEP]


def test_vectors_equal_sentence_transformers_over_several_batches(embedder, sentence_model):
    texts = [f"sentence {i} {'about cats ' * (i % 7)}" for i in range(70)]
    np.testing.assert_allclose(embedder.encode(texts, batch_size=32), sentence_model.encode(texts), atol=2e-6)
    assert embedder.dimension == sentence_model.get_embedding_dimension()
    assert embedder.max_tokens == sentence_model.max_seq_length


def test_instruction_goes_in_front_as_sentence_transformers_prompt(embedder, sentence_model):
    instruction = "Represent this sentence for searching relevant passages: "
    texts, counts = embedder.prepare(TEXTS[:2], [instruction] * 2)
    expected = sentence_model.encode(TEXTS[:2], prompt=instruction)
    np.testing.assert_allclose(embedder.encode(texts), expected, atol=2e-6)
    assert counts == embedder.count_tokens([instruction + t for t in TEXTS[:2]])
    assert not np.allclose(embedder.encode(texts), embedder.encode(TEXTS[:2]), atol=1e-3)


def test_a_text_over_the_limit_is_refused_with_its_row(embedder):
    assert embedder.max_tokens == 256
    with pytest.raises(InputTooLong, match=r"text_input\[1\] has 302 tokens, more than the embedding model's 256"):
        embedder.prepare(["short", "word " * 300])
    embedder.prepare(["word " * 254])  # 254 + [CLS] + [SEP] fits exactly


def copy_with_pooling(tmp_path, pooling: dict):
    """The packaged model with its Pooling module's config replaced."""
    model_dir = tmp_path / "model"
    shutil.copytree(embedding_model_dir(), model_dir)
    config = model_dir / "1_Pooling" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "pooling_mode_mean_tokens": False, **pooling}))
    return model_dir


@pytest.mark.parametrize("mode", ["pooling_mode_cls_token", "pooling_mode_max_tokens"])
def test_other_pooling_modes_equal_sentence_transformers(tmp_path, mode):
    from sentence_transformers import SentenceTransformer

    model_dir = copy_with_pooling(tmp_path, {mode: True})
    expected = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(SentenceEmbedder(model_dir).encode(TEXTS), expected, atol=2e-6)


def test_a_pipeline_it_does_not_compute_is_refused_naming_what(tmp_path):
    model_dir = copy_with_pooling(tmp_path, {"pooling_mode_lasttoken": True})
    with pytest.raises(UnsupportedEmbeddingModel, match="pooling_mode_lasttoken"):
        SentenceEmbedder(model_dir)
    modules = json.loads((model_dir / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (model_dir / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedEmbeddingModel, match="Dense"):
        SentenceEmbedder(model_dir)


def test_loading_imports_neither_sentence_transformers_nor_scikit_learn():
    script = (
        "import sys; from tritonllm.backend.embedding import SentenceEmbedder; SentenceEmbedder().encode(['x']); "
        "print(sorted(m for m in ('sentence_transformers', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
