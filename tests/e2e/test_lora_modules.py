"""LoRA adapters served by name through the real tritonserver, as vLLM users have them: PEFT folders given to the
shim (`--lora-modules`) or loaded at run time, answering with the openai SDK exactly as PEFT's own model does,
beside the base model in the same server."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from oracles import greedy_text, peft_adapter, peft_model

from tritonllm.shim.settings import ShimSettings

from .conftest import MODEL, running_shim

MESSAGES = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("peft-e2e")
    return {name: peft_adapter(tiny_model_dir, root / name, seed) for name, seed in (("a", 11), ("b", 12))}


@pytest.fixture(scope="module")
def lora_url(triton, adapters):
    modules = (f"a={adapters['a']}", json.dumps({"name": "b", "path": str(adapters["b"])}))
    settings = ShimSettings(
        triton_grpc_url=triton.grpc_url,
        served_model_name=MODEL,
        embedding_model_name=None,
        lora_modules=modules,
        allow_runtime_lora=True,
    )
    with running_shim(settings) as url:
        yield url


def expected(model, tokenizer) -> str:
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    return greedy_text(model, tokenizer, list(prompt), 16)[0]


def chat(url: str, model: str, **more) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    request = {"model": model, "messages": MESSAGES, "max_tokens": 16, "temperature": 0, **more}
    if more.get("stream"):
        return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**request))
    return client.chat.completions.create(**request).choices[0].message.content


def test_adapters_and_the_base_answer_by_name_as_peft(lora_url, adapters, tiny_model_dir, hf_model, tokenizer):
    models = httpx.get(f"{lora_url}/v1/models").json()["data"]
    assert [(m["id"], m.get("parent")) for m in models] == [(MODEL, None), ("a", MODEL), ("b", MODEL)]
    assert models[1]["root"] == str(adapters["a"])
    names = ["a", "b", MODEL, "a"]
    with ThreadPoolExecutor(len(names)) as pool:  # at once: the llm batches them together
        answers = list(pool.map(lambda name: chat(lora_url, name), names))
    wanted = {name: expected(peft_model(tiny_model_dir, folder), tokenizer) for name, folder in adapters.items()}
    wanted[MODEL] = expected(hf_model, tokenizer)
    assert answers == [wanted[name] for name in names]
    assert len(set(answers)) == 3
    assert chat(lora_url, "b", stream=True) == wanted["b"]
    completion = httpx.post(
        f"{lora_url}/v1/completions", json={"model": "a", "prompt": "Once", "max_tokens": 8, "temperature": 0}
    )
    once = greedy_text(peft_model(tiny_model_dir, adapters["a"]), tokenizer, tokenizer.encode("Once"), 8)[0]
    assert completion.json()["choices"][0]["text"] == once
    body = {"text_input": "Once", "parameters": {"max_new_tokens": 8}}
    assert httpx.post(f"{lora_url}/v2/models/a/generate", json=body, timeout=60).json()["text_output"] == once


def test_adapters_load_and_unload_at_run_time(lora_url, adapters):
    def post(route: str, **body) -> httpx.Response:
        return httpx.post(f"{lora_url}/v1/{route}", json=body, timeout=60)

    with pytest.raises(openai.NotFoundError, match="'c' does not exist"):
        chat(lora_url, "c")
    loaded = post("load_lora_adapter", lora_name="c", lora_path=str(adapters["b"]))
    assert loaded.status_code == 200 and "'c' added" in loaded.text
    assert chat(lora_url, "c") == chat(lora_url, "b")
    assert (
        post("load_lora_adapter", lora_name="a", lora_path=str(adapters["b"])).json()["error"]["param"] == "lora_name"
    )
    missing = post("load_lora_adapter", lora_name="d", lora_path="/nonexistent")
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "lora_path"
    assert post("unload_lora_adapter", lora_name="c").status_code == 200
    with pytest.raises(openai.NotFoundError):
        chat(lora_url, "c")
    assert post("unload_lora_adapter", lora_name="c").status_code == 404


def test_run_time_loading_is_off_unless_allowed(shim_url):
    response = httpx.post(f"{shim_url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"})
    assert response.status_code == 404
