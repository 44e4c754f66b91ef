"""Reasoning models through `serve` (the parser detected from the chat template) and the openai SDK: the thinking
in `reasoning_content` (chat) and reasoning items (Responses), the answer in `content`, together the model's own
text; tool calls read from the answer only; chat_template_kwargs turning thinking off. The tiny model's answers are
forced into shape by a guided regex, so that both parts are there whatever its random weights say."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest
from thinking_models import thinking_model
from transformers import AutoTokenizer
from triton_helpers import Stream, tensor

from tritonllm.shim.settings import ShimSettings

from .conftest import running_serve, running_shim

ASK = [{"role": "user", "content": "Think, then answer."}]
THOUGHT = r"[a-z]{3,8}( [a-z]{3,8}){2,4}"
ANSWER = r"[a-z]{3,8}( [a-z]{3,8}){1,3}\."
CALL = r'\{"name": "get_weather", "arguments": \{"city": "paris"\}\}'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass
class Served:
    style: str
    model_dir: Path
    client: openai.OpenAI  # `serve`'s shim, as it starts
    guided: openai.OpenAI  # a second shim on the same tritonserver, with --guide-reasoning
    grpc_url: str

    @property
    def model(self) -> str:
        return self.model_dir.name

    def regex(self, answer: str = ANSWER) -> str:
        """The model's whole text: a thinking block, then `answer`; under deepseek_r1's template the prompt
        opened the block, so the model writes from inside it."""
        opening = r"<think>\n" if self.style == "qwen3" else ""
        return opening + THOUGHT + r"\n</think>\n\n" + answer

    def chat(self, regex: str, stream: bool = False, **fields):
        extra = {key: fields.pop(key) for key in ("chat_template_kwargs",) if key in fields}
        return self.guided.chat.completions.create(
            model=self.model,
            messages=ASK,
            max_tokens=fields.pop("max_tokens", 60),
            temperature=0,
            stream=stream,
            extra_body={"guided_regex": regex, **extra},
            **fields,
        )

    def raw(self, regex: str, **template) -> tuple[str, int]:
        """The model's own text for ASK (completions on the rendered prompt: no parser there), and the prompt's
        length in tokens."""
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        prompt = tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False, **template)
        completion = self.client.completions.create(
            model=self.model,
            prompt=prompt,
            max_tokens=60,
            temperature=0,
            extra_body={"guided_regex": regex, "use_raw_prompt": True},
        )
        return completion.choices[0].text, completion.usage.prompt_tokens


@pytest.fixture(scope="module", params=["qwen3", "deepseek_r1"])
def served(request, tiny_model_dir, tmp_path_factory) -> Served:
    """`serve` on the tiny model with a chat template that thinks in the param's style."""
    root = tmp_path_factory.mktemp(f"thinking-{request.param}")
    model = thinking_model(tiny_model_dir, root / f"tiny-{request.param}", request.param)
    with running_serve(model, root, "--no-embedding") as ports:
        base = f"http://127.0.0.1:{ports['--shim-port']}/v1"
        client = openai.OpenAI(base_url=base, api_key="-", max_retries=0)
        grpc_url = f"127.0.0.1:{ports['--grpc-port']}"
        settings = ShimSettings(grpc_url, model.name, reasoning_parser=request.param, guide_reasoning=True)
        with running_shim(settings) as url:
            guided = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0)
            yield Served(request.param, model, client, guided, grpc_url)
    assert f"reasoning parser: {request.param}" in (root / "serve.log").read_text()


def test_thinking_and_answer_come_apart_and_join_to_the_models_text(served):
    whole = served.chat(served.regex())
    message = whole.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and message.content and "think>" not in reasoning + message.content
    raw, _ = served.raw(served.regex())
    opening = "<think>" if served.style == "qwen3" else ""
    assert raw == opening + reasoning + "</think>" + message.content
    streamed = list(served.chat(served.regex(), stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == message.content
    # the thinking's tokens: those up to the one that completes the closing tag
    tokens = [t.token for t in served.chat(served.regex(), logprobs=True).choices[0].logprobs.content]
    thinking_tokens = next(i + 1 for i in range(len(tokens)) if "</think>" in "".join(tokens[: i + 1]))
    assert whole.usage.completion_tokens_details.reasoning_tokens == thinking_tokens < len(tokens)
    assert streamed[-1].usage.completion_tokens_details.reasoning_tokens == thinking_tokens


def test_a_tool_call_is_read_from_the_answer_after_the_thinking(served):
    whole = served.chat(served.regex(CALL), tools=[WEATHER], max_tokens=200)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "paris"}
    assert choice.message.model_extra["reasoning_content"]
    streamed = list(served.chat(served.regex(CALL), stream=True, tools=[WEATHER], max_tokens=200))
    calls = [c for chunk in streamed if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert "".join(c.function.arguments or "" for c in calls) == call.function.arguments


def test_chat_template_kwargs_turn_thinking_off(served):
    off = {"enable_thinking": False} if served.style == "qwen3" else {"thinking": False}
    whole = served.chat(ANSWER, chat_template_kwargs=off)
    message = whole.choices[0].message
    assert message.model_extra["reasoning_content"] is None
    raw, prompt_tokens = served.raw(ANSWER, **off)
    assert message.content == raw
    assert whole.usage.prompt_tokens == prompt_tokens  # the template saw the variable: its prompt differs
    assert prompt_tokens != served.raw(ANSWER)[1]


def test_the_responses_api_gives_a_reasoning_item_before_the_message(served):
    chat = served.chat(served.regex()).choices[0].message
    response = served.guided.responses.create(
        model=served.model,
        input=ASK[0]["content"],
        max_output_tokens=60,
        temperature=0,
        extra_body={"guided_regex": served.regex()},
    )
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    assert response.output[0].content[0].text == chat.model_extra["reasoning_content"]
    assert response.output_text == chat.content
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    events = list(
        served.guided.responses.create(
            model=served.model,
            input=ASK[0]["content"],
            max_output_tokens=60,
            temperature=0,
            stream=True,
            extra_body={"guided_regex": served.regex()},
        )
    )
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == chat.model_extra["reasoning_content"]
    assert events[-1].response.output[0].content[0].text == thought


def test_anthropics_messages_api_gives_a_thinking_block_before_the_text(served):
    chat = served.chat(served.regex()).choices[0].message
    client = anthropic.Anthropic(base_url=str(served.guided.base_url).removesuffix("/v1/"), api_key="-", max_retries=0)
    ask = {
        "model": served.model,
        "max_tokens": 60,
        "messages": ASK,
        "thinking": {"type": "adaptive"},
        "extra_body": {"temperature": 0, "guided_regex": served.regex()},
    }
    message = client.messages.create(**ask)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == chat.model_extra["reasoning_content"]
    assert message.content[1].text == chat.content
    with client.messages.stream(**ask) as stream:
        events = list(stream)
    thought = "".join(
        e.delta.thinking for e in events if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    )
    assert thought == chat.model_extra["reasoning_content"]


def test_max_thinking_tokens_forces_the_closing_tag_and_the_answer_follows(served):
    ask = {"model": served.model, "messages": ASK, "max_tokens": 20, "temperature": 0}
    free = served.client.chat.completions.create(**ask).choices[0].message
    budgeted = served.client.chat.completions.create(**ask, extra_body={"max_thinking_tokens": 4})
    message = budgeted.choices[0].message
    if served.style == "qwen3":  # the tiny model never opens a block itself: nothing to cut short
        assert message.content == free.content and message.model_extra["reasoning_content"] is None
        assert budgeted.usage.completion_tokens_details.reasoning_tokens == 0
    else:  # the prompt opened the block, and the tiny model never closes it: all thinking, until the budget
        assert free.model_extra["reasoning_content"] and not free.content
        thought = message.model_extra["reasoning_content"]
        assert thought and free.model_extra["reasoning_content"].startswith(thought) and message.content
        closing = AutoTokenizer.from_pretrained(served.model_dir).encode("</think>", add_special_tokens=False)
        assert budgeted.usage.completion_tokens_details.reasoning_tokens == 4 + len(closing)
    with pytest.raises(openai.BadRequestError) as info:  # a grammar over the thinking too leaves no room for it
        served.guided.chat.completions.create(**ask, extra_body={"max_thinking_tokens": 4, "guided_regex": "[a-z]+"})
    assert info.value.body["param"] == "max_thinking_tokens"


def test_a_grammar_holds_the_answer_and_leaves_the_thinking_free(served):
    """As vLLM's reasoning-aware structured outputs: the model thinks freely (here 3 tokens, then the budget
    closes the block), then answers under the grammar."""
    ask = {"model": served.model, "messages": ASK, "max_tokens": 40, "temperature": 0}
    free = served.client.chat.completions.create(**ask).choices[0].message
    extra = {"max_thinking_tokens": 3, "guided_regex": ANSWER}
    guided = served.client.chat.completions.create(**ask, extra_body=extra)
    message = guided.choices[0].message
    assert re.fullmatch(ANSWER, message.content), message.content
    if served.style == "deepseek_r1":  # the thinking: the free answer's first tokens
        thought = message.model_extra["reasoning_content"]
        assert thought and free.model_extra["reasoning_content"].startswith(thought)
    streamed = served.client.chat.completions.create(**ask, extra_body=extra, stream=True)
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    assert "".join(d.content or "" for d in deltas) == message.content


def test_a_triton_client_gets_the_budget_from_the_prompt_alone(served):
    """Through the ensemble, without thinking_open: preprocessing tells from the rendered prompt whether the answer
    starts inside the block, as the shim's parser does from the template."""
    shim = served.client.chat.completions.create(
        model=served.model, messages=ASK, max_tokens=20, temperature=0, extra_body={"max_thinking_tokens": 3}
    )
    stream = Stream(served.grpc_url)
    try:
        stream.send(
            "ensemble",
            [
                tensor("chat_messages", [[json.dumps(ASK)]], "BYTES"),
                tensor("max_tokens", [[20]], "INT32"),
                tensor("thinking_budget", [[3]], "INT32"),
                tensor("stream", [[True]], "BOOL"),
            ],
        )
        text = "".join(r.as_numpy("text_output").reshape(-1)[0].decode() for r in stream.until_final())
    finally:
        stream.close()
    message = shim.choices[0].message
    opening = "<think>" if served.style == "qwen3" and message.model_extra["reasoning_content"] else ""
    closing = "</think>" if served.style == "deepseek_r1" else ""
    assert text == opening + (message.model_extra["reasoning_content"] or "") + closing + message.content
