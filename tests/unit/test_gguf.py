"""A .gguf file as the model: dequantized once into an HF directory, then served from the cache."""

from __future__ import annotations

from conftest import MODELS
from safetensors.torch import load_file

from tritonllm.formats import gguf
from tritonllm.formats.model_cache import cache_key


def test_a_gguf_file_converts_once_into_the_default_models_weights(smollm2_gguf, tmp_path, monkeypatch):
    file = smollm2_gguf
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path))
    told: list[str] = []
    converted = gguf.hf_model_dir(file, progress=told.append, dequantize=True)
    assert converted.parent == tmp_path and (converted / "config.json").exists()
    # a line at the start and the figures at the end: the conversion takes a while
    assert told[0].startswith(f"dequantizing {file.name} (") and told[0].endswith(f"into {converted}, once")
    assert len(told) == 2 and told[1].startswith(f"wrote {converted}: 272 tensors, ")
    key = cache_key(converted)
    assert gguf.hf_model_dir(file, progress=told.append, dequantize=True) == converted  # the second load finds it
    assert len(told) == 2  # and says nothing
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


def test_the_tensor_index_reads_what_gguf_py_reads(smollm2_gguf, tmp_path):
    """read_tensors skips the metadata values gguf-py decodes one element at a time; its tensors must be the
    same names, formats and bytes, shaped alike, on the default model's file and on one whose metadata holds
    every value type and whose tensors are 1, 2 and 3 dimensional, in plain and block formats."""
    import gguf as gguf_py
    import numpy as np

    written = tmp_path / "every-type.gguf"
    writer = gguf_py.GGUFWriter(str(written), "llama")
    writer.add_uint8("x.u8", 1)
    writer.add_int16("x.i16", -2)
    writer.add_float64("x.f64", 0.5)
    writer.add_bool("x.bool", True)
    writer.add_array("x.strings", ["a", "bc", ""])
    writer.add_array("x.ints", [1, 2, 3])
    writer.add_array("x.nested", [[1, 2], [3]])
    writer.add_tensor("plain", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    writer.add_tensor("vector", np.arange(5, dtype=np.float16))
    blocks = np.random.default_rng(0).integers(0, 256, (3, 34), dtype=np.uint8)
    writer.add_tensor("q8", blocks, raw_dtype=gguf_py.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for file in (smollm2_gguf, written):
        architecture, tensors = gguf.read_tensors(file)
        reader = gguf_py.GGUFReader(str(file))
        assert architecture == reader.fields["general.architecture"].contents() == "llama"
        assert [(t.name, t.type_name) for t in tensors] == [(t.name, t.tensor_type.name) for t in reader.tensors]
        for mine, theirs in zip(tensors, reader.tensors, strict=True):
            assert mine.data.shape == theirs.data.shape and mine.data.dtype == theirs.data.dtype
            assert np.array_equal(mine.data, theirs.data)
