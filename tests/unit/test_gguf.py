"""A .gguf file as the model: dequantized once into an HF directory, then served from the cache."""

from __future__ import annotations

from conftest import MODELS
from safetensors.torch import load_file

from tritonllm.runtime import gguf
from tritonllm.tokenizer.model_cache import cache_key


def test_a_gguf_file_converts_once_into_the_default_models_weights(smollm2_gguf, tmp_path, monkeypatch):
    file = smollm2_gguf
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path))
    converted = gguf.hf_model_dir(file)
    assert converted.parent == tmp_path and (converted / "config.json").exists()
    key = cache_key(converted)
    assert gguf.hf_model_dir(file) == converted  # the second load finds it
    # and touches no file: the tokenizer snapshot's key (the files' times) holds from start to start
    assert cache_key(converted) == key

    ours = load_file(converted / "model.safetensors")
    default = load_file(MODELS / "SmolLM2-135M-Instruct" / "model.safetensors")
    assert ours.keys() == default.keys()
    assert all(ours[name].equal(default[name]) for name in ours)
    assert "quantization_config" not in (converted / "config.json").read_text()
    assert gguf.source_file(converted) == file.resolve()  # so that the engine can keep its blocks quantized


def test_a_directory_is_its_own_model(tiny_model_dir):
    assert gguf.hf_model_dir(tiny_model_dir) == tiny_model_dir
