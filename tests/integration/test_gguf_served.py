"""The default model's Q4_1 GGUF file served by the real tritonserver, as `serve` serves a .gguf path: its layers
read from the file's blocks in place and the native stack, and greedy answers through the ensemble equal to
transformers' generate() on the dequantized weights."""

from __future__ import annotations

import pytest
import transformers
from conftest import launch_triton
from oracles import greedy_text
from triton_helpers import Stream

from tritonllm.formats import gguf

from .test_triton import ensemble_inputs, text_of

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def served_gguf(smollm2_gguf, tmp_path_factory):
    model_dir = gguf.hf_model_dir(smollm2_gguf)
    log_dir = tmp_path_factory.mktemp("gguf")
    server = launch_triton(model_dir, log_dir, settings={"num_kv_blocks": 256})
    yield server, model_dir, log_dir / "tritonserver.log"
    server.stop()


def test_a_gguf_file_is_served_on_its_blocks_exactly(served_gguf):
    server, model_dir, log = served_gguf
    assert "211 linear layers on GGUF blocks; decode steps on the native decoder stack" in log.read_text()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    dequantized = gguf.hf_model_dir(gguf.source_file(model_dir), dequantize=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(dequantized).eval()
    for prompt in PROMPTS:
        expected = greedy_text(hf, tokenizer, tokenizer.encode(prompt), 24)[0]
        stream = Stream(server.grpc_url)
        try:
            stream.send("ensemble", ensemble_inputs(prompt, 24), request_id=prompt)
            assert text_of(stream.until_final(timeout=120)) == expected
        finally:
            stream.close()
