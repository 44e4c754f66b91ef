"""Relevance scores of (query, document) pairs from a cross-encoder folder (a transformers sequence classifier
with one label, as sentence-transformers' CrossEncoder saves it), computed with transformers alone.

A pair is read as the tokenizer joins two texts ([CLS] query [SEP] document [SEP] for BERT) and scored as
CrossEncoder.predict scores it: the label's logit through the folder's activation (sentence-transformers'
default for one label, a sigmoid, unless the config names the identity). A pair over the model's token limit is
an error naming it, not truncated silently. Models with more labels, or another activation, are refused at load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from tritonllm.common.errors import RequestError

RERANK_MODEL_DIR_ENV = "TRITONLLM_RERANK_MODEL_DIR"
SIGMOID, IDENTITY = "torch.nn.modules.activation.Sigmoid", "torch.nn.modules.linear.Identity"


class PairTooLong(RequestError):
    def __init__(self, row: int, tokens: int, limit: int) -> None:
        super().__init__(f"document[{row}]", f"document[{row}] with the query has {tokens} tokens, over {limit}")
        self.row = row


class UnsupportedReranker(ValueError):
    """The folder is not a one-label cross-encoder this scorer computes; the message names why."""


def activation_of(model_dir: Path) -> str:
    """The folder's activation of the logit (SIGMOID or IDENTITY); raises UnsupportedReranker otherwise."""
    config = json.loads((model_dir / "config.json").read_text())
    labels = config.get("num_labels") or len(config.get("id2label") or {0: ""})
    if labels != 1:
        raise UnsupportedReranker(f"{model_dir}: {labels} labels (a reranker scores with one)")
    activation = (
        (config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function")  # sentence-transformers before 4.0
        or SIGMOID
    )
    if activation not in (SIGMOID, IDENTITY):
        raise UnsupportedReranker(f"{model_dir}: activation {activation} (served: Sigmoid, Identity)")
    return activation


class CrossEncoderScorer:
    def __init__(self, model_dir: Path, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.sigmoid = activation_of(model_dir) == SIGMOID
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir).to(device).eval()
        self.device = device
        self.max_tokens = int(
            min(self.tokenizer.model_max_length, getattr(self.model.config, "max_position_embeddings", 1 << 31))
        )

    def count_tokens(self, queries: list[str], documents: list[str]) -> list[int]:
        """Each pair's tokens, special tokens included; PairTooLong for the first over the model's limit."""
        counts = [len(ids) for ids in self.tokenizer(queries, documents)["input_ids"]] if queries else []
        for row, n in enumerate(counts):
            if n > self.max_tokens:
                raise PairTooLong(row, n, self.max_tokens)
        return counts

    def score(self, queries: list[str], documents: list[str], batch_size: int = 32) -> np.ndarray:
        """[pairs] float32 relevance scores."""
        import torch

        parts = [np.zeros(0, dtype=np.float32)]
        with torch.inference_mode():
            for start in range(0, len(queries), batch_size):
                end = start + batch_size
                batch = self.tokenizer(queries[start:end], documents[start:end], padding=True, return_tensors="pt").to(
                    self.device
                )
                logits = self.model(**batch).logits[:, 0].float()
                parts.append((torch.sigmoid(logits) if self.sigmoid else logits).cpu().numpy())
        return np.concatenate(parts)
