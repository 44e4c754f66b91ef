"""The real default model, SmolLM2-135M-Instruct, through tritonserver and the shim, with the openai SDK.

Its greedy chat answers must equal transformers' own on the same weights; its chat template renders no tools,
so tool calls take the `json` format with the tools in the system prompt.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import torch

from .conftest import SMOLLM2 as NAME
from .test_openai import WEATHER, streamed_calls

QUESTIONS = [
    "What is the capital of France?",
    "What is 2 + 2?",
    "Who wrote Romeo and Juliet?",
    "What color is the sky on a clear day?",
    "How many days are there in a week?",
]


@pytest.fixture(scope="module")
def client(smollm2_url):
    from openai import OpenAI

    return OpenAI(base_url=f"{smollm2_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()

    def answer(question: str, max_new_tokens: int) -> str:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
        return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)

    return answer


def ask(client, question: str, **kwargs):
    return client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": question}], temperature=0, **kwargs
    )


def test_greedy_answers_equal_transformers(client, reference):
    for question in QUESTIONS:
        assert ask(client, question, max_tokens=48).choices[0].message.content == reference(question, 48), question
    assert "Paris" in ask(client, QUESTIONS[0], max_tokens=48).choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_call(client, stream):
    kwargs = dict(tools=[WEATHER], tool_choice="required", max_tokens=64, stream=stream)
    if stream:
        calls, finish = streamed_calls(list(ask(client, "What is the weather in Paris this week?", **kwargs)))
    else:
        choice = ask(client, "What is the weather in Paris this week?", **kwargs).choices[0]
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls]
        finish = [choice.finish_reason]
    assert finish == ["tool_calls"] and [c["name"] for c in calls] == ["get_weather"]
    arguments = json.loads(calls[0]["arguments"])
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert arguments["city"] == "Paris"


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_call(client, stream):
    """The model chooses: asked for the call, it starts one, which the `json` format's grammar keeps valid."""
    question = "Call the function get_weather with city Paris and days 3. Reply with the JSON call only."
    kwargs = dict(tools=[WEATHER], tool_choice="auto", max_tokens=64, stream=stream)
    if stream:
        calls, finish = streamed_calls(list(ask(client, question, **kwargs)))
    else:
        choice = ask(client, question, **kwargs).choices[0]
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls]
        finish = [choice.finish_reason]
    assert finish == ["tool_calls"] and [c["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 3}


def test_auto_answers_in_words_when_the_model_does(client):
    choice = ask(client, QUESTIONS[0], tools=[WEATHER], tool_choice="auto", max_tokens=48).choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert "Paris" in choice.message.content


def test_timeout_ends_the_stream_with_an_error_event(smollm2_url):
    # The model counts on greedily (no end of sequence in 600 tokens, checked with transformers): 2000 tokens of a
    # 135M-parameter model take far more than the one second allowed on any CPU, unlike the tiny model's.
    body = {"text_input": "Count from 1 to 1000: 1, 2, 3, 4, 5,", "parameters": {"max_new_tokens": 2000, "timeout": 1}}
    with httpx.stream("POST", f"{smollm2_url}/v2/models/{NAME}/generate_stream", json=body, timeout=60) as r:
        raw = r.read().decode()
    events = [json.loads(b[len("data:") :]) for b in raw.split("\n\n") if b]
    assert events[0]["text_output"] and "error" not in events[0]
    assert events[-1]["error"]["code"] == 408 and "timed out" in events[-1]["error"]["message"]
