"""The fields vLLM users send beyond OpenAI's (honoured, or a 400 naming them), and fields no one here knows
(dropped with a Warning header, as vLLM does; a 400 on a shim started with strict_request_fields)."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from tritonllm.shim.settings import ShimSettings

from .conftest import MODEL, running_shim

CHAT = [{"role": "user", "content": "Pick one."}]
# route -> a valid body of it
BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": CHAT, "max_tokens": 6, "temperature": 0},
    "/v1/completions": {"model": MODEL, "prompt": "Hello", "max_tokens": 6, "temperature": 0},
    "/v1/responses": {"model": MODEL, "input": "Hello", "max_output_tokens": 6, "temperature": 0},
    "/tokenize": {"model": MODEL, "prompt": "Hello"},
}


@pytest.mark.parametrize("route", list(BODIES))
def test_unknown_fields_are_dropped_and_named_in_a_warning_header(shim_url, route):
    plain = httpx.post(shim_url + route, json=BODIES[route], timeout=60)
    extended = httpx.post(shim_url + route, json={**BODIES[route], "bogus": 1, "litellm_x": {"a": 1}}, timeout=60)
    assert plain.status_code == extended.status_code == 200, extended.text
    assert extended.headers["warning"] == '299 tritonllm "ignored fields: bogus, litellm_x"'
    assert "warning" not in plain.headers
    for key in ("choices", "output", "tokens"):
        if key in plain.json():
            assert _texts(extended.json()[key]) == _texts(plain.json()[key])


def test_unknown_field_names_any_client_sends_reach_the_header_escaped(shim_url):
    """Control and non-ASCII characters are not allowed in a header: sent as they were, the answer never left
    (schemathesis found it: the connection dropped)."""
    names = {"bad\x00name": 1, 'quote"': 2, "é\udb65\udfde": 3}
    response = httpx.post(shim_url + "/tokenize", content=json.dumps({**BODIES["/tokenize"], **names}), timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["warning"] == (
        '299 tritonllm "ignored fields: bad\\u0000name, quote\\", \\u00e9\\udb65\\udfde"'
    )
    long = httpx.post(shim_url + "/tokenize", json={**BODIES["/tokenize"], "x" * 600: 1}, timeout=60)
    assert long.headers["warning"] == f'299 tritonllm "ignored fields: {"x" * 509}..."'


def _texts(items) -> object:
    if isinstance(items, list) and items and isinstance(items[0], dict):
        return [item.get("text") or item.get("message") or item.get("content") for item in items]
    return items


def test_a_strict_shim_refuses_unknown_fields(triton):
    settings = ShimSettings(triton_grpc_url=triton.grpc_url, served_model_name=MODEL, strict_request_fields=True)
    with running_shim(settings) as url:
        for route, body in BODIES.items():
            r = httpx.post(url + route, json={**body, "bogus": 1}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == "bogus", (route, r.text)
            assert httpx.post(url + route, json=body, timeout=60).status_code == 200


def test_generate_stream_keeps_to_its_spec(shim_url):
    body = {"text_input": "Hi", "parameters": {"max_new_tokens": 2}, "bogus": 1}
    r = httpx.post(f"{shim_url}/v2/models/{MODEL}/generate", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "bogus"


def test_min_p_one_keeps_only_the_likeliest_token(openai_client):
    def text(**fields) -> str:
        return openai_client.completions.create(model=MODEL, prompt="Hello", max_tokens=12, **fields).choices[0].text

    greedy = text(temperature=0)
    assert text(temperature=1.0, seed=3, extra_body={"min_p": 1.0}) == greedy
    assert text(temperature=1.0, seed=3) != greedy  # sampling alone wanders off the greedy path


def test_min_tokens_holds_the_end_token_back(openai_client, tokenizer):
    ends_at_once = {"logit_bias": {str(tokenizer.eos_token_id): 100}}
    plain = openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=20, temperature=0, **ends_at_once)
    held = openai_client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=20, temperature=0, **ends_at_once, extra_body={"min_tokens": 7}
    )
    assert plain.usage.completion_tokens <= 1 and plain.choices[0].finish_reason == "stop"
    assert held.usage.completion_tokens >= 7 and held.choices[0].finish_reason == "stop"


CHOICES = ["alpha", "beta gamma", "δέλτα"]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},  # a bounded value: random weights write endless digits
    "required": ["ok"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("extra", "holds"),
    [
        ({"guided_choice": CHOICES}, lambda text: text in CHOICES),
        ({"structured_outputs": {"choice": CHOICES}}, lambda text: text in CHOICES),
        ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, lambda text: re.fullmatch("[0-9]{3}-[a-z]{2}", text)),
        ({"structured_outputs": {"regex": "(ab)+c"}}, lambda text: re.fullmatch("(ab)+c", text)),
        ({"guided_json": SCHEMA}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
        ({"guided_json": json.dumps(SCHEMA)}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
        ({"structured_outputs": {"json": SCHEMA}}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
        ({"structured_outputs": {"json_object": True}}, lambda text: isinstance(json.loads(text), dict)),
        ({"guided_grammar": 'start: "x" /[0-9]/ "y"'}, lambda text: re.fullmatch("x[0-9]y", text)),
    ],
)
@pytest.mark.parametrize("seed", [1, 2])
def test_guided_fields_constrain_chat_and_completions(openai_client, tokenizer, extra, holds, seed):
    fields = {"max_tokens": 60, "temperature": 1.0, "seed": seed, "extra_body": extra}
    if "json_object" in extra.get("structured_outputs", {}):  # any object: random weights write endless keys
        fields["logit_bias"] = {str(tokenizer.convert_tokens_to_ids(t)): 30 for t in ('"', "}")}
    chat = openai_client.chat.completions.create(model=MODEL, messages=CHAT, **fields)
    completion = openai_client.completions.create(model=MODEL, prompt="Answer:", **fields)
    for text, reason in (
        (chat.choices[0].message.content, chat.choices[0].finish_reason),
        (completion.choices[0].text, completion.choices[0].finish_reason),
    ):
        assert reason == "stop" and holds(text), text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_regex"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "response_format"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"priority": 2**31}, "priority"),  # any int32, as vLLM takes any integer
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
        ({"chat_template_kwargs": ["not", "an", "object"]}, "chat_template_kwargs"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),  # the server does not trust requests' templates
        ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ],
)
def test_what_is_taken_and_not_done_is_a_400_naming_it(openai_client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, extra_body=extra)
    assert info.value.body["param"].startswith(param), info.value.body


@pytest.mark.parametrize("priority", [-10, -1, 0, 3])
def test_priority_and_the_fields_that_change_nothing_here_are_taken(openai_client, priority):
    plain = openai_client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    taken = openai_client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=8,
        temperature=0,
        extra_body={"priority": priority, "spaces_between_special_tokens": False, "chat_template_kwargs": {}},
    )
    assert taken.choices[0].message.content == plain.choices[0].message.content


CONTINUED = [{"role": "user", "content": "Pick one."}, {"role": "assistant", "content": "I pick the"}]


def test_continue_final_message_continues_the_assistants_text_and_echo_repeats_it(openai_client, tokenizer):
    prompt = tokenizer.apply_chat_template(CONTINUED, continue_final_message=True, tokenize=False)
    assert prompt.endswith("I pick the")
    raw = openai_client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, extra_body={"use_raw_prompt": True}
    )
    ask = {"model": MODEL, "messages": CONTINUED, "max_tokens": 8, "temperature": 0}
    continued = openai_client.chat.completions.create(**ask, extra_body={"continue_final_message": True})
    assert continued.choices[0].message.content == raw.choices[0].text
    assert continued.usage.prompt_tokens == raw.usage.prompt_tokens
    echo = {"continue_final_message": True, "add_generation_prompt": False, "echo": True}
    echoed = openai_client.chat.completions.create(**ask, extra_body=echo)
    assert echoed.choices[0].message.content == "I pick the" + raw.choices[0].text
    streamed = openai_client.chat.completions.create(**ask, stream=True, extra_body=echo)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == echoed.choices[0].message.content


def test_a_trusted_server_renders_the_requests_own_template_with_its_variables(triton, openai_client, tokenizer):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ cue }}"
    prompt = "<user>Pick one.<assistant>"
    raw = openai_client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, extra_body={"use_raw_prompt": True}
    )
    settings = ShimSettings(triton_grpc_url=triton.grpc_url, served_model_name=MODEL, trust_request_chat_template=True)
    with running_shim(settings) as url:
        trusting = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        own = trusting.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=8,
            temperature=0,
            extra_body={"chat_template": template, "chat_template_kwargs": {"cue": "<assistant>"}},
        )
        with pytest.raises(openai.BadRequestError) as info:  # a template that cannot render: the request's fault
            trusting.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=8, extra_body={"chat_template": "{{ raise_exception('no') }}"}
            )
    assert own.choices[0].message.content == raw.choices[0].text
    assert own.usage.prompt_tokens == raw.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert "chat template could not render" in info.value.body["message"]


def test_return_tokens_as_token_ids_names_each_log_prob_token_by_its_id(openai_client, tokenizer):
    ask = {"model": MODEL, "messages": CHAT, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    plain = openai_client.chat.completions.create(**ask).choices[0].logprobs.content
    named = openai_client.chat.completions.create(**ask, extra_body={"return_tokens_as_token_ids": True})
    named = named.choices[0].logprobs.content
    assert len(named) == len(plain) == 6
    for by_text, by_id in zip(plain, named, strict=True):
        assert by_id.token.startswith("token_id:") and by_id.logprob == by_text.logprob
        assert tokenizer.decode([int(by_id.token.removeprefix("token_id:"))]) == by_text.token
        ids = [int(top.token.removeprefix("token_id:")) for top in by_id.top_logprobs]
        assert [tokenizer.decode([i]) for i in ids] == [top.token for top in by_text.top_logprobs]
    completion = openai_client.completions.create(
        model=MODEL,
        prompt="Hello there",
        max_tokens=3,
        temperature=0,
        echo=True,
        logprobs=1,
        extra_body={"return_tokens_as_token_ids": True},
    )
    lp = completion.choices[0].logprobs
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    assert ids[: len(ids) - 3] == tokenizer.encode("Hello there")  # the echoed prompt's ids, then the answer's
    assert all(k.startswith("token_id:") for top in lp.top_logprobs[1:] for k in top)
