"""`serve --speculative ngram` on the default model's Q4_1 file, through the real tritonserver and the openai SDK:
a code edit answered exactly as transformers' generate() answers it, streamed and whole, with drafts kept (the
llm's spec_decode metrics)."""

from __future__ import annotations

import types

import openai
import transformers
from oracles import greedy_text
from triton_helpers import metric

from tritonllm.runtime import gguf

from .conftest import running_serve

CODE = (
    "def area(width, height):\n    return width * height\n\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n"
)
ASK = [{"role": "user", "content": "Add a docstring to each function in this code:\n" + CODE}]


def test_ngram_speculation_answers_as_generate_with_drafts_kept(smollm2_gguf, tmp_path):
    model_dir = gguf.hf_model_dir(smollm2_gguf)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompt = list(tokenizer.apply_chat_template(ASK, add_generation_prompt=True, return_dict=True)["input_ids"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    expected = greedy_text(hf, tokenizer, prompt, 48)[0]

    flags = ("--speculative", "ngram", "--num-kv-blocks", "256", "--no-embedding", "--served-model-name", "smollm2")
    with running_serve(smollm2_gguf, tmp_path, *flags) as ports:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['--shim-port']}/v1", api_key="none")
        request = {"model": "smollm2", "messages": ASK, "max_tokens": 48, "temperature": 0}
        whole = client.chat.completions.create(**request)
        chunks = client.chat.completions.create(**request, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        server = types.SimpleNamespace(metrics_url=f"http://127.0.0.1:{ports['--metrics-port']}/metrics")
        kept = metric(server, "tritonllm_spec_decode_accepted_tokens_total")
        verified = metric(server, "tritonllm_spec_decode_draft_tokens_total")
        log = (tmp_path / "serve.log").read_text()
    assert whole.choices[0].message.content == streamed == expected
    assert 0 < kept <= verified
    assert "speculative decoding: ngram" in log
