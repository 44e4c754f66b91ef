"""What today's OpenAI SDK sends, beyond the basics: newer field names, ignored fields, refusals, API keys."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from tritonllm.shim.settings import ShimSettings

from .conftest import MODEL, running_shim

HELLO = [{"role": "user", "content": "Hello 你好"}]


def test_max_completion_tokens_is_max_tokens(openai_client):
    response = openai_client.chat.completions.create(
        model=MODEL, messages=HELLO, max_completion_tokens=5, extra_body={"ignore_eos": True}
    )
    assert response.usage.completion_tokens == 5


def test_developer_is_a_system_message(openai_client):
    def answer(role: str) -> str:
        messages = [{"role": role, "content": "Answer briefly."}, *HELLO]
        return (
            openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
            .choices[0]
            .message.content
        )

    assert answer("developer") == answer("system")


def test_fields_that_cannot_change_the_answer_are_accepted(openai_client):
    plain = openai_client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)
    decorated = openai_client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=8,
        temperature=0,
        store=False,
        metadata={"team": "a"},
        user="u1",
        service_tier="auto",
        reasoning_effort="low",
        verbosity="low",
        prompt_cache_key="k",
        safety_identifier="s",
        prediction={"type": "content", "content": "Hello"},
        modalities=["text"],
    )
    assert decorated.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(openai_client, extra, field):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, extra_body=extra)
    assert info.value.body["param"].startswith(field)


def test_logit_bias_forces_a_token(openai_client, tokenizer):
    token = tokenizer.encode(" batch", add_special_tokens=False)[0]
    response = openai_client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logit_bias={str(token): 100}
    )
    assert response.choices[0].text == tokenizer.decode([token] * 4)


def test_logit_bias_outside_the_vocabulary_is_a_400(openai_client, tokenizer):
    with pytest.raises(openai.BadRequestError, match="logit_bias_ids"):
        openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, logit_bias={str(len(tokenizer)): 5})


def test_deprecated_functions_become_tools(openai_client):
    function = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    choice = openai_client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=40, functions=[function], function_call={"name": "add"}
    ).choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["add"]


def test_models_retrieve(openai_client):
    assert openai_client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("no-such-model")


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405)])
def test_unknown_routes_and_methods_answer_openai_errors(shim_url, method, path, status):
    r = httpx.request(method, shim_url + path, timeout=10)
    assert r.status_code == status
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_generate_stream_echoes_the_clients_id_without_using_it_for_triton(shim_url):
    body = {"id": "mine", "text_input": "Hi", "parameters": {"max_new_tokens": 3}}
    events = [line for line in httpx.post(f"{shim_url}/v2/models/{MODEL}/generate", json=body, timeout=30).text.split()]
    assert '"id":"mine"' in "".join(events).replace(" ", "")


@pytest.fixture(scope="module")
def locked_shim(triton):
    settings = ShimSettings(triton_grpc_url=triton.grpc_url, served_model_name=MODEL, api_key="s3cret")
    with running_shim(settings) as url:
        yield url


@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/v2/models/tiny/generate", "/metrics"])
def test_an_api_key_is_required_on_every_route_but_health(locked_shim, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = httpx.post(locked_shim + path, headers=headers, json={}, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{locked_shim}/health", timeout=10).status_code == 200


def test_the_sdk_with_the_key_is_served(locked_shim):
    client = openai.OpenAI(base_url=f"{locked_shim}/v1", api_key="s3cret", max_retries=0)
    assert client.models.list().data[0].id == MODEL
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{locked_shim}/v1", api_key="nope", max_retries=0).models.list()


def test_echo_with_max_tokens_0_gives_the_prompts_log_probs(openai_client, tokenizer, hf_model):
    """What lm-eval's loglikelihood asks: each prompt token's log-probability given the tokens before it."""
    prompt = "The quick brown fox 你好"
    ids = tokenizer.encode(prompt)
    response = openai_client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    choice = response.choices[0]
    with torch.no_grad():
        logprobs = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, :-1], -1)
    expected = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert choice.text == prompt and choice.finish_reason == "length" and response.usage.completion_tokens == 0
    assert choice.logprobs.tokens == [tokenizer.decode([t]) for t in ids]
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert torch.allclose(torch.tensor(choice.logprobs.token_logprobs[1:]), expected, atol=1e-4)
    # the likeliest token, and the prompt's own where it is another (OpenAI: up to logprobs + 1 entries)
    best = [tokenizer.decode([t]) for t in logprobs.argmax(-1).tolist()]
    tops = choice.logprobs.top_logprobs[1:]
    assert [set(top) for top in tops] == [{b, t} for b, t in zip(best, choice.logprobs.tokens[1:], strict=True)]


def test_echo_streams_the_prompt_once(openai_client):
    kwargs = dict(model=MODEL, prompt="Hello 你好", max_tokens=6, echo=True, temperature=0)
    streamed = "".join(c.choices[0].text for c in openai_client.completions.create(stream=True, **kwargs))
    whole = openai_client.completions.create(**kwargs).choices[0].text
    assert streamed == whole and whole.startswith("Hello 你好") and whole.count("Hello 你好") == 1


def test_max_tokens_0_needs_echo(openai_client):
    with pytest.raises(openai.BadRequestError, match="echo"):
        openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=0)


def test_prompts_as_token_ids(openai_client, tokenizer, hf_model):
    prompts = ["Hello", "The quick brown"]
    ids = [tokenizer.encode(p) for p in prompts]
    by_text = openai_client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    by_ids = openai_client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    one = openai_client.completions.create(model=MODEL, prompt=ids[1], max_tokens=6, temperature=0, echo=True)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert one.choices[0].text == tokenizer.decode(ids[1]) + by_text.choices[1].text


def test_token_id_prompts_score_like_lm_eval_asks(openai_client, tokenizer, hf_model):
    ids = tokenizer.encode("数据 model token batch")
    lp = (
        openai_client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
        .choices[0]
        .logprobs
    )
    with torch.no_grad():
        logprobs = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, :-1], -1)
    expected = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert len(lp.token_logprobs) == len(ids) and lp.token_logprobs[0] is None
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), expected, atol=1e-4)


@pytest.mark.parametrize("prompt", [[], [[]], [-1], [[1, 2], []]])
def test_bad_token_id_prompts_are_400s(openai_client, prompt):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert info.value.body["param"].startswith("prompt")


def test_token_ids_outside_the_vocabulary_are_a_400(openai_client, tokenizer):
    with pytest.raises(openai.BadRequestError, match="prompt_token_ids"):
        openai_client.completions.create(model=MODEL, prompt=[1, len(tokenizer)], max_tokens=2)


def test_the_shim_exports_its_own_metrics(openai_client, shim_url):
    openai_client.models.list()
    text = httpx.get(f"{shim_url}/metrics", timeout=10).text
    assert 'tritonllm_shim_requests_total{route="/v1/models",status="200"}' in text
    assert 'tritonllm_shim_response_start_seconds_count{route="/v1/models"}' in text


@pytest.mark.parametrize("limit", [{"max_tokens": 2047}, {"max_completion_tokens": 10**9}])
@pytest.mark.parametrize("stream", [False, True])  # a stream's status waits for its first token
def test_max_tokens_beyond_the_context_is_a_400_giving_the_numbers(openai_client, limit, stream):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=MODEL, messages=HELLO, stream=stream, **limit)
    assert info.value.body["param"] == "max_tokens"
    assert "the context holds 2048 tokens" in info.value.body["message"]


def test_truncation_makes_room_for_max_tokens(openai_client):
    response = openai_client.completions.create(
        model=MODEL, prompt="word " * 300, max_tokens=2000, temperature=0, extra_body={"error_behavior": "truncate"}
    )
    assert response.usage.prompt_tokens == 48


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_cut_off_ends_with_length_and_no_markup(openai_client, stream):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    kwargs = dict(model=MODEL, messages=HELLO, tools=[tool], tool_choice="required", max_tokens=2, stream=stream)
    response = openai_client.chat.completions.create(**kwargs)
    if stream:
        chunks = [c.choices[0] for c in response if c.choices]
        content = "".join(c.delta.content or "" for c in chunks)
        finish = [c.finish_reason for c in chunks if c.finish_reason]
    else:
        content, finish = response.choices[0].message.content or "", [response.choices[0].finish_reason]
    assert finish == ["length"] and "tool_call" not in content
