"""The OpenAI routes through the real openai SDK, checked against transformers' greedy output."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from oracles import greedy_ids, greedy_text
from triton_helpers import metric, wait_for

from .conftest import EMBEDDING_MODEL, MODEL

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "你好, who are you? 😀"}]


def chat_prompt_ids(tokenizer) -> list[int]:
    return list(
        tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )


def test_models_lists_the_llm_and_the_embedding_model(openai_client):
    assert [m.id for m in openai_client.models.list().data] == [MODEL, EMBEDDING_MODEL]


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
        ("completions", {"model": MODEL, "prompt": "x", "logprobs": 6}, "logprobs"),
        ("completions", {"model": MODEL, "prompt": "x", "n": 2, "temperature": 0}, "temperature"),
        ("completions", {"model": MODEL, "prompt": "x", "n": 3, "best_of": 2}, "best_of"),
        ("completions", {"model": MODEL, "prompt": "x", "use_beam_search": True, "stop": ["a"]}, "use_beam_search"),
        ("completions", {"model": MODEL, "prompt": "x", "error_behavior": "ignore"}, "error_behavior"),
        ("completions", {"model": MODEL, "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        ("completions", {"model": MODEL, "prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
        (
            "chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 21},
            "top_logprobs",
        ),
        (
            "chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
        ),
        (
            "chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
            "tool_choice",
        ),
        (
            "chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
            "response_format",
        ),
        (
            "chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema"},
            },
            "response_format",
        ),
        ("completions", {"model": MODEL}, "prompt"),
    ],
)
def test_bad_requests_get_400_naming_the_field(shim_url, route, body, field):
    r = httpx.post(f"{shim_url}/v1/{route}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert field in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("route", ["v1/chat/completions", "v1/completions", f"v2/models/{MODEL}/generate"])
def test_json_nested_past_reason_is_400_and_the_next_request_is_served(shim_url, route):
    """100,000 nested arrays: Python's JSON parser runs out of stack (a RecursionError, not a ValueError)."""
    deep = b'{"model": "%s", "prompt": ' % MODEL.encode() + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{shim_url}/{route}", content=deep, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "nested too deeply" in r.text or "recursion limit" in r.text, r.text
    tool_arguments = "[" * 100_000 + "]" * 100_000  # a past tool call's arguments, kept as text
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": tool_arguments}}
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}]
    messages.append({"role": "tool", "tool_call_id": "c1", "content": "ok"})
    body = {"model": MODEL, "messages": messages, "max_tokens": 2}
    r = httpx.post(f"{shim_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code in (200, 400), r.text
    r = httpx.post(f"{shim_url}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text


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
    # at least: another test's cancellation may be counted meanwhile; the freed blocks show it was this one
    assert wait_for(lambda: metric(triton, "tritonllm_requests_finished_total", cancelled) >= before + 1)
    assert wait_for(lambda: metric(triton, "tritonllm_kv_blocks_used") == 0)


def chat(openai_client, **kwargs):
    return openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], **kwargs
    )


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a"],
            "additionalProperties": False,
        },
    },
}


def streamed_calls(chunks) -> tuple[list[dict], list[str]]:
    """Tool calls put together from their deltas (id and name first, then the arguments in pieces)."""
    for chunk in chunks:
        for choice in chunk.choices:
            indexes = [c.index for c in choice.delta.tool_calls or []]
            assert len(indexes) == len(set(indexes))  # one entry a call in each chunk
    calls: dict[int, dict] = {}
    for delta in (ch.delta for chunk in chunks for ch in chunk.choices):
        for piece in delta.tool_calls or []:
            if piece.id is not None:
                assert piece.index not in calls and piece.function.name
                calls[piece.index] = {"id": piece.id, "name": piece.function.name, "arguments": ""}
            calls[piece.index]["arguments"] += piece.function.arguments or ""
    finish = [ch.finish_reason for chunk in chunks for ch in chunk.choices if ch.finish_reason]
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_parse_and_validate(openai_client, choice, stream):
    kwargs = dict(tools=[WEATHER, ADD], tool_choice=choice, max_tokens=120, temperature=1.0, seed=3)
    if stream:
        calls, finish = streamed_calls(list(chat(openai_client, stream=True, **kwargs)))
    else:
        response = chat(openai_client, **kwargs)
        message = response.choices[0].message
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls]
        finish = [response.choices[0].finish_reason]
    # OpenAI ends a call forced by name with "stop"
    assert calls and finish == ["tool_calls" if choice == "required" else "stop"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}
    for call in calls:
        assert isinstance(choice, str) or call["name"] == "add"
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


def test_streamed_tool_calls_equal_the_whole_answer(openai_client):
    kwargs = dict(tools=[WEATHER, ADD], tool_choice="required", max_tokens=120, temperature=1.0, seed=5)
    streamed, _ = streamed_calls(list(chat(openai_client, stream=True, **kwargs)))
    whole = chat(openai_client, **kwargs).choices[0].message.tool_calls
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c.function.name, c.function.arguments) for c in whole]


def test_parallel_tool_calls_false_makes_at_most_one_call(openai_client):
    kwargs = dict(tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False, max_tokens=120, seed=3)
    for seed in range(3):
        calls = chat(openai_client, **{**kwargs, "seed": seed}).choices[0].message.tool_calls
        assert len(calls) == 1


def test_auto_tool_choice_without_a_call_is_plain_text(openai_client, tokenizer):
    """tool_choice auto leaves the choice to the model: one kept from opening a call (the hermes tag biased away)
    answers in text, with no calls and a text finish reason. (With hermes, auto is not grammar-guarded, so the
    random model's own calls are not valid ones; forced calls are held to their schema by the tests above.)"""
    opening = tokenizer.convert_tokens_to_ids("<tool_call>")
    kwargs = dict(tools=[WEATHER], max_tokens=40, temperature=0, logit_bias={str(opening): -100})
    choice = chat(openai_client, **kwargs).choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    assert choice.message.content and "<tool_call>" not in choice.message.content


SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
            "n": {"type": "integer", "minimum": -3, "maximum": 3},
        },
        "required": ["name", "tags", "n"],
        "additionalProperties": False,
    },
]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("seed", [1, 2])
def test_json_schema_response_format_validates(openai_client, schema, seed):
    response = chat(
        openai_client,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}},
        max_tokens=150,
        temperature=1.0,
        seed=seed,
    )
    jsonschema.validate(json.loads(response.choices[0].message.content), schema)


def test_json_object_response_format_parses(openai_client, tokenizer):
    """Any object is allowed, and a model with random weights writes endless keys; biased towards the quote
    and the closing brace it ends its object soon, and the object must then end the answer and parse."""
    bias = {str(tokenizer.convert_tokens_to_ids(t)): 30 for t in ('"', "}")}
    for seed in range(4):
        response = chat(
            openai_client,
            response_format={"type": "json_object"},
            max_tokens=60,
            temperature=1,
            seed=seed,
            logit_bias=bias,
        )
        choice = response.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(json.loads(choice.message.content), dict)


def test_chat_logprobs_n_and_timings(openai_client):
    response = chat(
        openai_client,
        logprobs=True,
        top_logprobs=3,
        n=2,
        max_tokens=6,
        temperature=1.0,
        seed=4,
        extra_body={"ignore_eos": True},  # every choice 6 tokens long, so each has 6 entries
    )
    assert [c.index for c in response.choices] == [0, 1] and response.usage.completion_tokens == 12
    for choice in response.choices:
        content = choice.logprobs.content
        assert len(content) == 6 and "".join(token.token for token in content) == choice.message.content
        for token in content:
            assert token.logprob <= 0 and len(token.top_logprobs) == 3
            assert token.top_logprobs[0].logprob >= token.logprob - 1e-5
    extra = response.model_extra  # a time for each token after the first, however the server merged them
    assert extra["prefill_time"] > 0 and len(extra["decode_time_arr"]) == 5


def test_completions_logprobs_echo_suffix_and_usage_arrays(openai_client):
    response = openai_client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=5,
        temperature=0,
        logprobs=2,
        echo=True,
        suffix="<END>",
        extra_body={"ignore_eos": True},
    )
    choice = response.choices[0]
    assert choice.text.startswith("Hello") and choice.text.endswith("<END>")
    lp = choice.logprobs  # with echo, the prompt's tokens come first (the first has no log-probability)
    prompt_tokens = response.usage.prompt_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs) == prompt_tokens + 5
    assert lp.text_offset[0] == 0 and lp.text_offset[prompt_tokens] == len("".join(lp.tokens[:prompt_tokens]))
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    # the 2 likeliest, and the token itself where it is neither (OpenAI: up to logprobs + 1)
    assert all(
        token in top and len(top) in (2, 3) for token, top in zip(lp.tokens[1:], lp.top_logprobs[1:], strict=True)
    )
    usage = response.usage.model_extra
    assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == 5


def test_completions_list_prompts_best_of_and_beam_search(openai_client, tokenizer, hf_model):
    batch = openai_client.completions.create(model=MODEL, prompt=["Hello", "The quick"], max_tokens=4, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    for prompt, choice in zip(["Hello", "The quick"], batch.choices, strict=True):
        assert choice.text == greedy_text(hf_model, tokenizer, tokenizer.encode(prompt), 4)[0]
    best = openai_client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=4, n=2, extra_body={"best_of": 4}, seed=1
    )
    assert len(best.choices) == 2
    beams = openai_client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=6, n=2, temperature=0, extra_body={"use_beam_search": True}
    )
    assert len(beams.choices) == 2 and beams.choices[0].text != beams.choices[1].text


def test_stop_token_ids_end_and_are_left_out(openai_client, tokenizer, hf_model):
    ids = tokenizer.encode("Hello")
    free = greedy_ids(hf_model, ids, 8, eos=tokenizer.eos_token_id)
    stop = free[3]
    body = dict(model=MODEL, prompt="Hello", max_tokens=8, temperature=0, extra_body={"stop_token_ids": [stop]})
    cut = openai_client.completions.create(**body)
    upto = free[: free.index(stop)]
    assert cut.choices[0].text == tokenizer.decode(upto, skip_special_tokens=True)
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].model_extra["stop_reason"] == stop
    body["extra_body"]["include_stop_str_in_output"] = True
    kept = openai_client.completions.create(**body)
    assert kept.choices[0].text == tokenizer.decode(upto + [stop], skip_special_tokens=True)


def test_prompt_over_the_limit_is_400_with_numbers_or_truncated(shim_url):
    long = "word " * 3000
    r = httpx.post(f"{shim_url}/v1/completions", json={"model": MODEL, "prompt": long, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and "at most" in r.json()["error"]["message"]
    r = httpx.post(
        f"{shim_url}/v1/completions",
        json={"model": MODEL, "prompt": long, "max_tokens": 2, "error_behavior": "truncate"},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_text_over_4mb_is_413(shim_url):
    body = {"model": MODEL, "prompt": "x" * (4 * 1024 * 1024 + 1)}
    assert httpx.post(f"{shim_url}/v1/completions", json=body, timeout=60).status_code == 413
