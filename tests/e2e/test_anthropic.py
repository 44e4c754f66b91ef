"""Anthropic's Messages API through the shim, with Anthropic's own SDK: each answer equals what the chat route
answers for the same chat (itself held to transformers' generate()), the stream joined equals the whole message,
tools make a round trip, stop sequences stop, errors come in Anthropic's shape."""

from __future__ import annotations

import anthropic
import httpx
import jsonschema
import pytest

from .conftest import MODEL
from .test_openai import WEATHER as CHAT_WEATHER

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {  # the chat tests' tool, as Anthropic declares one
    "name": "get_weather",
    "description": "The weather in a city over some days",
    "input_schema": CHAT_WEATHER["function"]["parameters"],
}


GREEDY = {"temperature": 0}  # the API reference's earlier sampling field, which this SDK no longer names


@pytest.fixture(scope="module")
def client(shim_url):
    return anthropic.Anthropic(base_url=shim_url, api_key="unused", max_retries=0)


def chat_text(openai_client, messages: list, max_tokens: int, **extra) -> str:
    answer = openai_client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, extra_body=GREEDY, **extra
    )
    return answer.choices[0].message.content


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_a_message_equals_the_chat_routes_answer(client, openai_client):
    system = "You answer briefly."
    message = client.messages.create(
        model=MODEL, max_tokens=12, extra_body=GREEDY, system=system, messages=QUESTION, metadata={"user_id": "u1"}
    )
    expected = chat_text(openai_client, [{"role": "system", "content": system}, *QUESTION], 12)
    assert text_of(message) == expected
    assert message.role == "assistant" and message.type == "message" and message.id.startswith("msg_")
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert message.usage.output_tokens == (12 if message.stop_reason == "max_tokens" else message.usage.output_tokens)
    assert (
        message.usage.input_tokens
        == client.messages.count_tokens(model=MODEL, system=system, messages=QUESTION).input_tokens
    )


def test_the_stream_joined_equals_the_whole_message(client):
    whole = client.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=QUESTION)
    with client.messages.stream(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert streamed == text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_round_trip(client, stream):
    choice = {"type": "tool", "name": "get_weather"}
    ask = {"model": MODEL, "max_tokens": 64, "extra_body": GREEDY, "tools": [WEATHER], "tool_choice": choice}
    if stream:
        with client.messages.stream(**ask, messages=QUESTION) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**ask, messages=QUESTION)
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, WEATHER["input_schema"])
    result = {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "Sunny, 21 C"}]}
    turns = [*QUESTION, {"role": "assistant", "content": message.content}, {"role": "user", "content": [result]}]
    answer = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, tools=[WEATHER], messages=turns)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.input_tokens > message.usage.input_tokens  # the call and its result are in the prompt


def test_a_stop_sequence_stops_before_it_and_says_which(client):
    whole = text_of(client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=QUESTION))
    word = next(w for w in whole.split()[1:] if w.strip())
    message = client.messages.create(
        model=MODEL, max_tokens=24, extra_body=GREEDY, messages=QUESTION, stop_sequences=["zzz-never", word]
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == word
    assert text_of(message) == whole[: whole.index(word)]


def test_errors_come_in_anthropics_shape(client, shim_url):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=0, messages=QUESTION)
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="nope", max_tokens=4, messages=QUESTION)
    assert info.value.body["error"]["type"] == "not_found_error"
    missing = httpx.post(f"{shim_url}/v1/messages", json={"model": MODEL, "messages": QUESTION}, timeout=30)
    assert missing.status_code == 400 and missing.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.json()["error"]["message"]
    bad_role = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.role"):
        client.messages.create(**bad_role)
    server_tool = [{"type": "web_search_20250305", "name": "web_search"}]
    with pytest.raises(anthropic.BadRequestError, match="tools.0"):
        client.messages.create(model=MODEL, max_tokens=4, messages=QUESTION, tools=server_tool)
