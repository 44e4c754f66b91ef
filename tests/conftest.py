"""Fixtures shared by every test: the demo model folder (built on first use)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("TRITONLLM_TEST_MODELS", PROJECT_ROOT / "models"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    path = MODELS / "tiny"
    if not (path / "config.json").exists():
        from tritonllm.runtime.demo_model import build_demo_models

        build_demo_models(MODELS, ["tiny"], progress=lambda _: None)
    return path


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
