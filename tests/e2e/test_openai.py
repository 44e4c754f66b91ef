"""The OpenAI routes through the real openai SDK, checked against transformers' greedy output."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from oracles import greedy_text
from triton_helpers import metric, wait_for

from .conftest import MODEL

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "你好, who are you? 😀"}]


def chat_prompt_ids(tokenizer) -> list[int]:
    return list(
        tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )


def test_models_lists_the_served_model(openai_client):
    assert [m.id for m in openai_client.models.list().data] == [MODEL]


def test_chat_stream_and_non_stream_equal_transformers(openai_client, tokenizer, hf_model):
    expected, ids = greedy_text(hf_model, tokenizer, chat_prompt_ids(tokenizer), 24)
    whole = openai_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    chunks = list(
        openai_client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == streamed == expected
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == ("stop" if len(ids) < 24 else "length")
    assert whole.usage.prompt_tokens == len(chat_prompt_ids(tokenizer))
    assert whole.usage.completion_tokens == len(ids)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_completions_stream_and_non_stream_equal_transformers(openai_client, tokenizer, hf_model):
    prompt = "The quick brown fox 数据"
    expected, ids = greedy_text(hf_model, tokenizer, tokenizer.encode(prompt), 20)
    whole = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    stream = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text == expected
    assert whole.usage.completion_tokens == len(ids)


def test_seeded_sampling_repeats(openai_client):
    def ask(seed: int) -> str:
        return (
            openai_client.completions.create(
                model=MODEL,
                prompt="Hello",
                max_tokens=16,
                temperature=1.0,
                top_p=0.95,
                seed=seed,
                extra_body={"top_k": 50},
            )
            .choices[0]
            .text
        )

    assert ask(7) == ask(7)
    assert ask(7) != ask(8)


def test_stop_string_cuts_stream_and_non_stream_alike(openai_client, tokenizer, hf_model):
    prompt = "Hello 你好"
    free, _ = greedy_text(hf_model, tokenizer, tokenizer.encode(prompt), 30)
    stop = free[6:9]
    expected = free[: free.index(stop)]
    whole = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop])
    stream = openai_client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=stop, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text == expected
    assert whole.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == "stop"


def test_sse_framing_ends_with_done(shim_url):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{shim_url}/v1/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    for event in events[:-2]:
        json.loads(event[len("data: ") :])


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("chat/completions", {"model": MODEL, "messages": []}, "messages"),
        ("chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ("chat/completions", {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
        ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": ""}]}, "messages.0.content"),
        (
            "chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content",
        ),
        ("completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("completions", {"model": MODEL, "prompt": "x", "temperature": -1}, "temperature"),
        ("completions", {"model": MODEL, "prompt": "x", "top_p": 1.5}, "top_p"),
        ("completions", {"model": MODEL, "prompt": "x", "top_k": 0}, "top_k"),
        ("completions", {"model": MODEL, "prompt": "x", "seed": -3}, "seed"),
        ("completions", {"model": MODEL, "prompt": "x", "stop": [""]}, "stop"),
        ("completions", {"model": MODEL, "prompt": "x", "logprobs": 2}, "logprobs"),
        ("completions", {"model": MODEL}, "prompt"),
    ],
)
def test_bad_requests_get_400_naming_the_field(shim_url, route, body, field):
    r = httpx.post(f"{shim_url}/v1/{route}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert field in error["message"] and error["type"] == "invalid_request_error"


def test_unknown_model_is_404(openai_client):
    with pytest.raises(openai.NotFoundError, match="nope"):
        openai_client.completions.create(model="nope", prompt="x", max_tokens=2)


def test_client_disconnect_stops_the_generation(shim_url, triton):
    cancelled = 'reason="cancelled"'
    before = metric(triton, "tritonllm_requests_finished_total", cancelled)
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 1900, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{shim_url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
    assert wait_for(lambda: metric(triton, "tritonllm_requests_finished_total", cancelled) == before + 1)
    assert wait_for(lambda: metric(triton, "tritonllm_kv_blocks_used") == 0)
