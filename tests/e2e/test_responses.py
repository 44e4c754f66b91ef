"""POST /v1/responses through the openai SDK: the same answers as chat, the SDK's own stream parser, tools,
structured output, and clear refusals of what needs stored state."""

from __future__ import annotations

import json
from typing import Annotated

import jsonschema
import openai
import pydantic
import pytest

from .conftest import MODEL

ADD = {
    "type": "function",
    "name": "add",
    "description": "Adds two numbers",
    "parameters": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["a", "b"],
    },
}


def chat_tool(tool: dict) -> dict:
    """A Responses API function tool as the chat API writes it."""
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def chat_text(openai_client, messages: list[dict], **kwargs) -> str:
    response = openai_client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kwargs)
    return response.choices[0].message.content


def test_a_response_is_the_chat_answer(openai_client):
    response = openai_client.responses.create(
        model=MODEL, input="Hello 你好", instructions="Be brief.", max_output_tokens=12, temperature=0
    )
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello 你好"}]
    assert response.output_text == chat_text(openai_client, messages, max_tokens=12)
    assert response.object == "response" and response.store is False and response.model == MODEL
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and 0 < usage.output_tokens <= 12
    length_cut = usage.output_tokens == 12
    assert response.status == ("incomplete" if length_cut else "completed")
    assert (response.incomplete_details is not None) == length_cut


def test_input_items_are_messages(openai_client):
    items = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "And now?"},
    ]
    response = openai_client.responses.create(model=MODEL, input=items, max_output_tokens=10, temperature=0)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And now?"},
    ]
    assert response.output_text == chat_text(openai_client, messages, max_tokens=10)


def test_the_sdks_stream_helper_rebuilds_the_whole_response(openai_client):
    kwargs = dict(model=MODEL, input="Tell me a story", max_output_tokens=24, temperature=0)
    with openai_client.responses.stream(**kwargs) as stream:
        events = list(stream)
    final = events[-1].response  # response.completed, or response.incomplete at max_output_tokens
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    whole = openai_client.responses.create(**kwargs)
    assert deltas == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_function_call(openai_client, stream):
    kwargs = dict(
        model=MODEL, input="What is 2 + 3?", tools=[ADD], tool_choice="required", max_tool_calls=1, max_output_tokens=80
    )
    if stream:
        with openai_client.responses.stream(**kwargs, temperature=1.0) as s:
            events = list(s)
            response = s.get_final_response()
        streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        calls = [item for item in response.output if item.type == "function_call"]
        assert streamed == "".join(c.arguments for c in calls)
    else:
        response = openai_client.responses.create(**kwargs, temperature=1.0)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and response.status == "completed"
    for call in calls:
        assert call.name == "add" and call.call_id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), ADD["parameters"])


def test_a_conversation_with_a_function_result(openai_client):
    items = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 2, "b": 3}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ]
    response = openai_client.responses.create(
        model=MODEL, input=items, tools=[ADD], max_output_tokens=8, temperature=0, tool_choice="none"
    )
    # the same conversation as chat messages: the call an assistant turn, its output a tool turn
    messages = [
        items[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    chat = openai_client.chat.completions.create(
        model=MODEL, messages=messages, tools=[chat_tool(ADD)], tool_choice="none", max_tokens=8, temperature=0
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens


class Answer(pydantic.BaseModel):
    ok: bool
    n: Annotated[int, pydantic.Field(ge=0, le=9)]


def test_structured_output_parses(openai_client):
    response = openai_client.responses.parse(
        model=MODEL, input="Answer in JSON", text_format=Answer, max_output_tokens=60, temperature=1.0
    )
    assert isinstance(response.output_parsed, Answer)


def test_logprobs_when_included(openai_client):
    response = openai_client.responses.create(
        model=MODEL,
        input="Hi",
        max_output_tokens=6,
        temperature=0,
        top_logprobs=2,
        include=["message.output_text.logprobs"],
    )
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == response.usage.output_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in logprobs)
    assert "".join(t.token for t in logprobs) == response.output_text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools.0"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content"),
        ({"input": [{"role": "user", "content": ""}]}, "input.0.content"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
        ({"input": [{"type": "function_call_output", "output": "5"}]}, "input.0.call_id"),
        ({"input": [{"type": "function_call", "name": "add", "arguments": "{}"}]}, "input.0"),
        ({"max_output_tokens": 5000}, "max_output_tokens"),
        ({"max_output_tokens": 5000, "stream": True}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_it(openai_client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.responses.create(**{"model": MODEL, "input": "Hi", "max_output_tokens": 4, **extra})
    assert info.value.body["param"] == param
