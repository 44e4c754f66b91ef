"""A GGUF file served from the file itself (formats/gguf_weights.py, engine/layers/gguf_linear.py): a folder of its
config and tokenizer alone, every matrix read in its own blocks where the file is mapped, and greedy output equal to
transformers' generate() on the file dequantized."""

from __future__ import annotations

from collections import Counter

import gguf as gguf_py
import numpy as np
import pytest
import torch
import transformers
from oracles import greedy_ids

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.layers.gguf_linear import GGUFEmbedding, GGUFLinear
from tritonllm.engine.models import weight_memory
from tritonllm.engine.models.gguf_model import ScaledGGUFEmbedding
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.formats import gguf, gguf_weights

PROMPTS = ("The capital of France is", "def fibonacci(n):", "1, 2, 3,")


@pytest.fixture(scope="module")
def file_folder(smollm2_gguf):
    return gguf.hf_model_dir(smollm2_gguf)


def test_the_folder_holds_the_files_config_and_tokenizer_and_no_weights(smollm2_gguf, file_folder):
    names = {p.name for p in file_folder.iterdir()}
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= names
    assert not [n for n in names if n.endswith((".safetensors", ".bin", ".pt"))]
    assert sum(p.stat().st_size for p in file_folder.iterdir()) < 10 * 2**20  # no copy of the weights
    assert gguf.source_file(file_folder) == smollm2_gguf.resolve()
    config = transformers.AutoConfig.from_pretrained(file_folder)
    assert config.architectures == ["LlamaForCausalLM"] and config.num_hidden_layers == 30
    ours = transformers.AutoTokenizer.from_pretrained(file_folder)
    theirs = transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    assert ours("héllo, <|im_start|> wörld").input_ids == theirs("héllo, <|im_start|> wörld").input_ids
    assert ours.chat_template == theirs.chat_template


def test_every_matrix_is_read_in_place_from_the_files_mapping(smollm2_gguf, file_folder):
    engine = LLMEngine(EngineConfig(str(file_folder), num_kv_blocks=64))
    model = engine.runner.model
    assert engine.runner.model_reads_file and not engine.runner.transformers
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert engine.runner.quantized_layers == 211  # 7 a layer in 30 layers, and the output layer
    assert engine.runner.decoder_stack is not None
    # no float32 matrix anywhere: the parameters are the norms alone
    assert max(p.numel() for p in model.parameters()) == model.config.hidden_size
    layer = model.model.layers[3]
    # v and the MLP's rows are the file's pages, where the file is mapped (q and k: copies of their blocks, in
    # transformers' row order)
    file_pages = weight_memory.file_mappings(smollm2_gguf)
    for linear in (layer.self_attn.v_proj.base, layer.mlp.down_proj.base):  # under their LoRA wrappers
        assert isinstance(linear, GGUFLinear) and linear.type_name == "Q4_1"
        assert any(start <= linear.raw.data_ptr() < end for start, end in file_pages)
    # the output layer reads the embedding's Q8_0 rows (tied): one table for both
    embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(embedding, GGUFEmbedding) and output.raw.data_ptr() == embedding.raw.data_ptr()
    assert output.type_name == "Q8_0"


def test_a_gemma3_file_is_read_in_place_through_transformers_modules(gemma3_gguf):
    """An architecture the Llama-family build does not take (engine/models/gguf_model.py): transformers' Gemma 3
    modules, built without weights, with every matrix the file's rows in their own types and the norms copied."""
    folder = gguf.hf_model_dir(gemma3_gguf)
    assert folder.name.endswith("-file") and not list(folder.glob("*.safetensors"))
    engine = LLMEngine(EngineConfig(str(folder), num_kv_blocks=64))
    runner, model = engine.runner, engine.runner.model
    assert runner.model_reads_file and runner.transformers
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert runner.quantized_layers == 7 * 18 + 1  # q, k, v, o, gate, up, down in 18 layers, and the output layer
    assert max(p.dim() for p in model.parameters()) == 1  # norms alone: no float32 matrix
    # each in the file's type (the output layer: the embedding's Q8_0 rows), where the file is mapped
    linears = [getattr(m, "base", m) for m in model.modules() if isinstance(getattr(m, "base", m), GGUFLinear)]
    matrices = [t.type_name for t in gguf.read_tensors(gemma3_gguf)[1] if t.data.ndim == 2]
    assert Counter(linear.type_name for linear in set(linears)) == Counter(matrices)
    assert {"Q5_0", "Q4_K", "Q6_K", "Q8_0"} <= set(matrices)
    file_pages = weight_memory.file_mappings(gemma3_gguf)
    assert all(any(start <= m.raw.data_ptr() < end for start, end in file_pages) for m in linears)
    embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(embedding, ScaledGGUFEmbedding) and embedding.scale.item() == pytest.approx(640**0.5)
    assert output.raw.data_ptr() == embedding.raw.data_ptr() and output.type_name == "Q8_0"  # tied


@pytest.mark.parametrize("file", ["smollm2_gguf", "gemma3_gguf"])
def test_greedy_output_equals_generate_on_the_dequantized_file(file, request):
    """SmolLM2's Q4_1 file through the engine's Llama-family build, Gemma 3's Q4_K_M through transformers' modules;
    the oracle: transformers' own GGUF load, dequantized to float32."""
    path = request.getfixturevalue(file)
    folder = gguf.hf_model_dir(path)
    engine = LLMEngine(EngineConfig(str(folder), num_kv_blocks=64))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    seqs = [Sequence(p, SamplingParams(max_tokens=16)) for p in prompts]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    assert [s.output_ids for s in seqs] == [greedy_ids(hf.eval(), p, 16) for p in prompts]


def test_q_and_k_rows_are_put_back_in_transformers_order():
    """llama.cpp's converter permutes each head's q/k rows; the inverse order undoes it (its permute, applied to
    transformers' rows, then ours, gives transformers' rows back)."""
    heads, rows = 4, 32
    hf_rows = np.arange(rows)
    file_rows = hf_rows.reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(rows)  # convert_hf_to_gguf
    assert (file_rows[gguf_weights.unpermuted_rows(rows, heads)] == hf_rows).all()


def test_a_matrix_in_a_type_without_a_kernel_is_refused_at_load_naming_it(smollm2_gguf, tmp_path, monkeypatch):
    from tritonllm.engine.layers import gguf_linear

    monkeypatch.setattr(gguf_linear, "kernel_types", lambda: frozenset({gguf_py.GGMLQuantizationType.Q8_0.value}))
    with pytest.raises(UnsupportedModelError, match=r"no kernel here reads GGUF type\(s\) \['Q4_1'\]"):
        LLMEngine(EngineConfig(str(gguf.hf_model_dir(smollm2_gguf)), num_kv_blocks=64))


@pytest.fixture
def folder_writes(tmp_path, monkeypatch) -> list:
    """Which of hf_model_dir's two folders gets written, for which file: the writers recorded, not run."""
    calls = []

    def recorded(name):
        def write(file, out, progress):
            calls.append((name, out))
            out.mkdir(parents=True)
            return out

        return write

    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "convert", recorded("convert"))
    monkeypatch.setattr(gguf, "describe", recorded("describe"))
    return calls


def test_an_architecture_the_build_does_not_read_is_dequantized_instead(tmp_path, folder_writes):
    written = tmp_path / "other.gguf"
    writer = gguf_py.GGUFWriter(str(written), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    folder = gguf.hf_model_dir(written)
    assert folder_writes == [("convert", folder)] and not folder.name.endswith("-file")
    assert "'gpt2' is not read in place" in gguf.how_served(written)


@pytest.mark.parametrize("quantized_weights", ["true", "false"])
def test_float32_weights_are_served_only_when_asked_for(smollm2_gguf, folder_writes, quantized_weights):
    """quantized_weights false (a config.pbtxt parameter, or serve's --quantized-weights false) is the user asking
    for the file dequantized; otherwise the file is read in place."""
    import json

    from conftest import PROJECT_ROOT

    from tritonllm.backend.model_parameters import ModelParameters

    parameters = {"model_dir": str(smollm2_gguf), "quantized_weights": quantized_weights}
    config = {"parameters": {k: {"string_value": v} for k, v in parameters.items()}}
    args = {"model_config": json.dumps(config), "model_repository": str(PROJECT_ROOT / "model_repository" / "llm")}
    try:
        ModelParameters(args).model_dir()
    except FileNotFoundError:  # the recorded writer leaves no config.json
        pass
    assert folder_writes[0][0] == ("describe" if quantized_weights == "true" else "convert")


def test_the_load_checks_verdict_is_kept_for_the_same_file_code_and_settings(file_folder, tmp_path, monkeypatch):
    """The probe is most of a real-size file's load; a start with the same file, folder, code, kernel build and
    settings reads its verdict, any other runs it."""
    from tritonllm.engine.execution import model_check
    from tritonllm.formats import model_cache

    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path))
    probes = []
    check = model_check.check_against_eager
    monkeypatch.setattr(model_check, "check_against_eager", lambda *a: probes.append(1) or check(*a))
    first = LLMEngine(EngineConfig(str(file_folder), num_kv_blocks=64))
    again = LLMEngine(EngineConfig(str(file_folder), num_kv_blocks=64))
    assert len(probes) == 1 and again.runner.decoder_stack is not None
    assert first.runner.decoder_stack is not None
    LLMEngine(EngineConfig(str(file_folder), num_kv_blocks=64, kv_cache_dtype="bfloat16"))
    assert len(probes) == 2  # another setting, another verdict
