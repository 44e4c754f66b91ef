"""What clients built on vLLM's server send beyond everyday OpenAI requests (RL rollouts, evals, gateways), as
vLLM answers it: prompt log-probabilities on chat, returned token ids, prompt truncation, usage on every chunk,
`model` left out, vLLM's model cards; and OpenAI's own cross-field rules. The oracles are transformers' model on
the same ids, and this server's own /tokenize."""

from __future__ import annotations

import itertools
import json

import httpx
import openai
import pytest
import torch

from .conftest import MODEL

CHAT = [{"role": "user", "content": "Tell me about paged attention."}]


def chat(client: openai.OpenAI, **extra_body):
    return client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0, extra_body=extra_body
    )


def prompt_ids_of(shim_url: str, messages: list[dict]) -> list[int]:
    return httpx.post(f"{shim_url}/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]


def test_return_token_ids_gives_the_prompts_and_each_choices_ids(openai_client, shim_url, tokenizer):
    response = chat(openai_client, return_token_ids=True)
    extra = response.model_extra
    assert extra["prompt_token_ids"] == prompt_ids_of(shim_url, CHAT)
    choice = response.choices[0]
    assert tokenizer.decode(choice.model_extra["token_ids"]) == choice.message.content
    assert len(choice.model_extra["token_ids"]) == response.usage.completion_tokens
    chunks = list(
        openai_client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=6, temperature=0, stream=True, extra_body={"return_token_ids": True}
        )
    )
    assert chunks[0].model_extra["prompt_token_ids"] == extra["prompt_token_ids"]
    streamed = [t for c in chunks for choice in c.choices for t in choice.model_extra.get("token_ids") or []]
    assert streamed == choice.model_extra["token_ids"]
    plain = chat(openai_client)  # not asked for: null, as vLLM sends them, so that the SDK's attributes read None
    assert plain.prompt_token_ids is None and plain.prompt_logprobs is None and plain.choices[0].token_ids is None
    whole = openai_client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    assert whole.choices[0].token_ids is None and whole.choices[0].prompt_token_ids is None
    assert whole.choices[0].prompt_logprobs is None


def test_completions_return_token_ids_per_choice(openai_client, tokenizer):
    response = openai_client.completions.create(
        model=MODEL, prompt="Hello 你好", max_tokens=5, temperature=0, extra_body={"return_token_ids": True}
    )
    choice = response.choices[0].model_extra
    assert choice["prompt_token_ids"] == tokenizer.encode("Hello 你好")
    assert tokenizer.decode(choice["token_ids"]) == response.choices[0].text


def test_chat_prompt_logprobs_are_transformers_log_softmax_with_ranks(openai_client, shim_url, hf_model):
    ids = prompt_ids_of(shim_url, CHAT)
    response = chat(openai_client, prompt_logprobs=2)
    entries = response.model_extra["prompt_logprobs"]
    with torch.no_grad():
        logprobs = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    assert entries[0] is None and len(entries) == len(ids)
    for position, (entry, token) in enumerate(zip(entries[1:], ids[1:], strict=True)):
        row = logprobs[position]
        own = entry[str(token)]
        assert own["logprob"] == pytest.approx(row[token].item(), abs=1e-4)
        assert (row > row[token] + 1e-4).sum() + 1 <= own["rank"] <= (row > row[token] - 1e-4).sum() + 1
        best = row.topk(2)
        assert (
            {str(t) for t in best.indices.tolist()}
            <= set(entry)
            <= {str(t) for t in best.indices.tolist()} | {str(token)}
        )
    assert response.choices[0].logprobs is None  # the answer's log-probs only with logprobs: true


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"prompt_logprobs": -1}, "prompt_logprobs"),  # the whole vocabulary: over vLLM's default max of 20
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": -2}, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"truncate_prompt_tokens": 100000}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": 3, "truncation_side": "middle"}, "truncation_side"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream: true
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"top_logprobs": 0}, "top_logprobs"),
    ],
)
def test_what_vllm_and_openai_refuse_is_a_400_naming_the_field(shim_url, extra, param):
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 4, **extra}
    r = httpx.post(f"{shim_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("side", ["left", "right", None])
def test_truncate_prompt_tokens_keeps_the_end_or_the_start(openai_client, shim_url, side):
    full = prompt_ids_of(shim_url, CHAT)
    extra = {"truncate_prompt_tokens": 7, "return_token_ids": True} | ({"truncation_side": side} if side else {})
    response = chat(openai_client, **extra)
    assert response.model_extra["prompt_token_ids"] == (full[:7] if side == "right" else full[-7:])
    assert response.usage.prompt_tokens == 7
    fitted = chat(openai_client, truncate_prompt_tokens=-1, return_token_ids=True)  # all of it fits
    assert fitted.model_extra["prompt_token_ids"] == full


def stream_chunks(shim_url: str, stream_options: dict | None, **extra) -> list[dict]:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 5, "temperature": 0, "stream": True, **extra}
    if stream_options is not None:
        body["stream_options"] = stream_options
    with httpx.stream("POST", f"{shim_url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_usage_goes_where_stream_options_say(shim_url):
    default = stream_chunks(shim_url, None)  # the pages' examples: on the last choice chunk
    assert [c.get("usage") is not None for c in default] == [False] * (len(default) - 1) + [True]
    assert default[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in stream_chunks(shim_url, {"include_usage": False}))
    own = stream_chunks(shim_url, {"include_usage": True})  # OpenAI's: a chunk of its own, after the choices
    assert [c["choices"] == [] for c in own] == [False] * (len(own) - 1) + [True]
    assert [c.get("usage") is not None for c in own] == [False] * (len(own) - 1) + [True]
    every = stream_chunks(shim_url, {"include_usage": True, "continuous_usage_stats": True}, return_token_ids=True)
    assert all(
        c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"] for c in every
    )
    completions = [c["usage"]["completion_tokens"] for c in every]
    assert completions == sorted(completions) and completions[-1] == own[-1]["usage"]["completion_tokens"] == 5
    # vLLM's count: none on the role chunk, then the tokens so far on each chunk that carries some
    assert every[0]["choices"][0]["delta"].get("role") == "assistant"
    carried = [len(c["choices"][0].get("token_ids") or []) if c["choices"] else 0 for c in every]
    assert completions == list(itertools.accumulate(carried)), (completions, carried)


def test_completions_logprobs_0_give_the_sampled_token(openai_client):
    response = openai_client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=0)
    logprobs = response.choices[0].logprobs
    assert logprobs.top_logprobs == [{t: lp} for t, lp in zip(logprobs.tokens, logprobs.token_logprobs, strict=True)]


def test_model_left_out_is_the_served_model(shim_url):
    for route, body in [
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}),
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 2}),
        ("/v1/responses", {"input": "Hello", "max_output_tokens": 2}),
    ]:
        r = httpx.post(shim_url + route, json=body, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == MODEL, (route, r.text)


def test_model_cards_have_vllms_root_parent_and_max_model_len(openai_client, tiny_model_dir):
    [card] = [m for m in openai_client.models.list().data if m.id == MODEL]
    assert card.model_extra["root"] == str(tiny_model_dir)
    assert card.model_extra["parent"] is None and card.model_extra["max_model_len"] == 2048
