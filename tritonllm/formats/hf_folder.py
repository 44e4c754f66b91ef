"""An HF model folder: its config.json and its tokenizer."""

from __future__ import annotations

import json
import os
from pathlib import Path


def load_tokenizer(model_dir: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def load_model_config(model_dir: Path) -> dict:
    """The HF model's config.json."""
    return json.loads((model_dir / "config.json").read_text())
