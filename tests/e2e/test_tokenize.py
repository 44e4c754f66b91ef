"""/tokenize and /detokenize, vLLM's shapes, checked against the tokenizer and against what generation counts."""

from __future__ import annotations

import httpx
import pytest

from .conftest import MODEL

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello 你好"}]


def post(shim_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(shim_url + path, json=body, timeout=30)


def test_a_prompt_tokenizes_as_the_tokenizer_does(shim_url, tokenizer):
    prompt = "Hello 你好 world"
    r = post(shim_url, "/tokenize", {"model": MODEL, "prompt": prompt, "return_token_strs": True}).json()
    ids = tokenizer.encode(prompt)
    assert r == {
        "count": len(ids),
        "max_model_len": 2048,
        "tokens": ids,
        "token_strs": tokenizer.convert_ids_to_tokens(ids),
    }
    bare = post(shim_url, "/tokenize", {"prompt": prompt, "add_special_tokens": False}).json()
    assert bare["tokens"] == tokenizer.encode(prompt, add_special_tokens=False) and bare["token_strs"] is None


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_messages_tokenize_as_the_chat_template_renders_them(shim_url, tokenizer, generation_prompt):
    body = {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": generation_prompt}
    tokens = post(shim_url, "/tokenize", body).json()["tokens"]
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=generation_prompt, tokenize=False)
    assert tokens == tokenizer.encode(rendered, add_special_tokens=False)


def test_the_count_is_what_a_chat_completion_counts(shim_url, openai_client):
    count = post(shim_url, "/tokenize", {"messages": MESSAGES}).json()["count"]
    usage = openai_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1).usage
    assert count == usage.prompt_tokens


def test_a_continued_message_tokenizes_as_the_chat_that_continues_it(shim_url, openai_client, tokenizer):
    """vLLM's continue_final_message: the assistant's last message left open, on /tokenize as on chat."""
    messages = [*MESSAGES, {"role": "assistant", "content": "Sure,"}]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    tokens = post(shim_url, "/tokenize", body).json()["tokens"]
    rendered = tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert tokens == tokenizer.encode(rendered, add_special_tokens=False) and rendered.endswith("Sure,")
    extra = {"continue_final_message": True, "add_generation_prompt": False, "return_token_ids": True}
    response = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, extra_body=extra)
    assert response.model_extra["prompt_token_ids"] == tokens
    assert (
        post(shim_url, "/tokenize", {"messages": messages, "continue_final_message": True}).json()["tokens"] == tokens
    )


def test_add_special_tokens_puts_the_tokenizers_own_on_the_rendered_chat(shim_url, tokenizer):
    tokens = post(shim_url, "/tokenize", {"messages": MESSAGES, "add_special_tokens": True}).json()["tokens"]
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert tokens == tokenizer.encode(rendered, add_special_tokens=True)


def test_detokenize_inverts_tokenize(shim_url, tokenizer):
    text = "Hello 你好, <|im_start|> and tabs\t."
    tokens = post(shim_url, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert post(shim_url, "/detokenize", {"model": MODEL, "tokens": tokens}).json() == {"prompt": text}
    assert post(shim_url, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/detokenize", {"tokens": [1, 10**8]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
        ("/tokenize", {"prompt": "x", "messages": MESSAGES}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": ""}]}, 400, "messages.0.content"),
        ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
    ],
)
def test_bad_requests_name_the_field(shim_url, path, body, status, param):
    r = post(shim_url, path, body)
    assert r.status_code == status and r.json()["error"]["param"] == param


def test_tokenizer_info_tells_what_a_remote_tokenizer_needs(shim_url, tokenizer):
    info = httpx.get(f"{shim_url}/tokenizer_info", timeout=30).json()
    assert info["eos_token"] == tokenizer.eos_token and info["chat_template"] == tokenizer.chat_template
    assert info["model_max_length"] == 2048 and info["vocab_size"] == len(tokenizer)
