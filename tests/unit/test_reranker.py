"""The cross-encoder scorer (backend/reranker.py) against sentence-transformers' own CrossEncoder.predict on the
same folder; pairs over the limit and models it cannot score refused by name (served: tests/e2e/test_rerank.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from sentence_transformers import CrossEncoder

from tritonllm.backend.reranker import IDENTITY, CrossEncoderScorer, PairTooLong, UnsupportedReranker

PAIRS = [
    ("what is the capital of France?", "Paris is the capital of France."),
    ("what is the capital of France?", "Bananas are yellow."),
    ("how many legs does a spider have", "A spider has eight legs, an insect six."),
    ("", "an empty query"),
]


def test_scores_equal_cross_encoder_predict(cross_encoder_dir):
    expected = CrossEncoder(str(cross_encoder_dir), device="cpu").predict(PAIRS)
    scores = CrossEncoderScorer(cross_encoder_dir).score([q for q, _ in PAIRS], [d for _, d in PAIRS], batch_size=3)
    assert scores == pytest.approx(expected, abs=1e-6)
    assert np.all((scores > 0) & (scores < 1))  # one label: a sigmoid, as CrossEncoder applies


def test_a_folder_that_names_the_identity_scores_logits(cross_encoder_dir, tmp_path):
    folder = shutil.copytree(cross_encoder_dir, tmp_path / "identity")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"sentence_transformers": {"activation_fn": IDENTITY}}))
    expected = CrossEncoder(str(folder), device="cpu").predict(PAIRS)
    scores = CrossEncoderScorer(folder).score([q for q, _ in PAIRS], [d for _, d in PAIRS])
    assert scores == pytest.approx(expected, abs=1e-6)
    assert np.any(scores < 0)


def test_a_pair_over_the_limit_is_named(cross_encoder_dir):
    scorer = CrossEncoderScorer(cross_encoder_dir)
    assert scorer.count_tokens(["a b"], ["c"]) == [6]  # [CLS] a b [SEP] c [SEP]
    with pytest.raises(PairTooLong, match=r"document\[1\] with the query has \d+ tokens, over 128"):
        scorer.count_tokens(["q", "q"], ["short", "word " * 200])


@pytest.mark.parametrize(
    ("change", "refusal"),
    [({"num_labels": 3, "id2label": {"0": "a", "1": "b", "2": "c"}}, "3 labels"),
     ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}, "activation .*Tanh")],
)  # fmt: skip
def test_what_cannot_be_scored_is_refused_naming_why(cross_encoder_dir, tmp_path, change, refusal):
    folder = shutil.copytree(cross_encoder_dir, tmp_path / "other")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(UnsupportedReranker, match=refusal):
        CrossEncoderScorer(folder)
