"""Qwen3, Phi-3, Gemma 2 and Gemma 3 files served from the file through transformers' modules
(engine/models/gguf_model.py): tiny random models built by transformers, converted to Q8_0 by llama.cpp's own converter
(the sources the pinned llama-cpp-python sdist vendors, bench/peers.py), greedy output through the engine equal to
transformers' generate() on the file dequantized. Slow (the sdist is fetched and unpacked once): `make test-slow`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from architectures import TINY_SIZES
from oracles import greedy_ids

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.formats import gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

pytestmark = pytest.mark.slow

VOCAB = 1000
SIZES = {**TINY_SIZES, "vocab_size": VOCAB, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
FAMILIES = {  # head widths other than hidden / heads, and windows the 40-token prompt crosses
    "qwen3": ("Qwen3Config", {"head_dim": 48}),
    "qwen3_biased": ("Qwen3Config", {"head_dim": 48, "attention_bias": True}),  # biases on q/k/v and o
    "phi3": ("Phi3Config", {}),
    "gemma2": ("Gemma2Config", {"head_dim": 48, "sliding_window": 16, "attn_logit_softcapping": 5.0}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 48, "sliding_window": 16, "query_pre_attn_scalar": 24}),
}


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory) -> Path:
    """A 1,000-piece sentencepiece model trained on the docs: llama.cpp's converters of these families read one."""
    import sentencepiece

    out = tmp_path_factory.mktemp("spm")
    root = Path(__file__).resolve().parents[2]
    (out / "corpus.txt").write_text("".join(p.read_text() for p in [root / "README.md", *root.glob("docs/*.md")]))
    sentencepiece.SentencePieceTrainer.train(
        input=str(out / "corpus.txt"), model_prefix=str(out / "spm"), vocab_size=VOCAB, model_type="bpe",
        byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
    )  # fmt: skip
    return out / "spm.model"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_files_greedy_output_through_transformers_modules_equals_generate(family, sentencepiece_model, tmp_path):
    from peers import llama_cpp_sources

    name, settings = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, name)(**SIZES, **settings)
    folder = tmp_path / family
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    shutil.copy(sentencepiece_model, folder / "tokenizer.model")
    file = tmp_path / f"{family}-q8_0.gguf"
    sources = llama_cpp_sources()
    converter = [sys.executable, str(sources / "convert_hf_to_gguf.py"), str(folder), "--outtype", "q8_0"]
    env = {**os.environ, "PYTHONPATH": str(sources / "gguf-py")}
    subprocess.run([*converter, "--outfile", str(file)], check=True, env=env, capture_output=True)
    served = gguf.hf_model_dir(file)
    engine = LLMEngine(EngineConfig(str(served), num_kv_blocks=64))
    assert engine.runner.model_reads_file and engine.runner.transformers
    prompts = [[(7 * i + 13 * j) % 900 + 50 for j in range(length)] for i, length in enumerate((5, 40, 9))]
    seqs = [Sequence(p, SamplingParams(max_tokens=12)) for p in prompts]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    # the oracle reads the served folder's config: transformers' own GGUF config leaves Qwen3's head width at 128
    hf_config = transformers.AutoConfig.from_pretrained(served)
    assert getattr(hf_config, "head_dim", 16) == settings.get("head_dim", 16)  # 16: hidden / heads
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        file.parent, gguf_file=file.name, config=hf_config, dtype=torch.float32
    )
    assert [s.output_ids for s in seqs] == [greedy_ids(hf.eval(), p, 12) for p in prompts]
