"""Everyday requests of the openai SDK against a running shim; prints each one's outcome and the count that worked.

.venv/bin/python client/openai_everyday.py --base-url http://127.0.0.1:9000 --model SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import httpx
from openai import OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
HELLO = [{"role": "user", "content": "Say hello."}]


def requests(client: OpenAI, model: str, embedding_model: str) -> dict[str, Callable[[], object]]:
    chat = client.chat.completions.create
    return {
        "chat": lambda: chat(model=model, messages=HELLO, max_tokens=8),
        "chat, streamed with usage": lambda: list(
            chat(model=model, messages=HELLO, max_tokens=8, stream=True, stream_options={"include_usage": True})
        ),
        "chat, max_completion_tokens": lambda: chat(model=model, messages=HELLO, max_completion_tokens=8),
        "chat, developer role": lambda: chat(
            model=model, messages=[{"role": "developer", "content": "Be brief."}, *HELLO], max_tokens=8
        ),
        "chat, logit_bias": lambda: chat(model=model, messages=HELLO, max_tokens=4, logit_bias={"42": 5}),
        "chat, metadata / store / user / service_tier": lambda: chat(
            model=model, messages=HELLO, max_tokens=4, metadata={"a": "b"}, store=False, user="u", service_tier="auto"
        ),
        "chat, reasoning_effort": lambda: chat(model=model, messages=HELLO, max_tokens=4, reasoning_effort="low"),
        "chat, n and seed": lambda: chat(model=model, messages=HELLO, max_tokens=4, n=2, seed=1),
        "chat, logprobs": lambda: chat(model=model, messages=HELLO, max_tokens=4, logprobs=True, top_logprobs=2),
        "chat, tools auto": lambda: chat(model=model, messages=HELLO, max_tokens=24, tools=[WEATHER]),
        "chat, parallel_tool_calls false": lambda: chat(
            model=model,
            messages=HELLO,
            max_tokens=48,
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
        ),
        "chat, json_schema": lambda: chat(
            model=model,
            messages=HELLO,
            max_tokens=32,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        ),
        "completions": lambda: client.completions.create(model=model, prompt="Hello", max_tokens=8),
        "completions, token ids": lambda: client.completions.create(model=model, prompt=[1, 2, 3], max_tokens=4),
        "completions, lists of token ids": lambda: client.completions.create(
            model=model, prompt=[[1, 2], [3, 4]], max_tokens=4
        ),
        "completions, echo + logprobs + max_tokens 0": lambda: client.completions.create(
            model=model, prompt="The capital of France is Paris", max_tokens=0, echo=True, logprobs=1
        ),
        "responses": lambda: client.responses.create(model=model, input="Say hello.", max_output_tokens=8),
        "responses, streamed": lambda: list(
            client.responses.create(model=model, input="Say hello.", max_output_tokens=8, stream=True)
        ),
        "models.list": lambda: client.models.list(),
        "models.retrieve": lambda: client.models.retrieve(model),
        "embeddings": lambda: client.embeddings.create(model=embedding_model, input=["one", "two"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:9000")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--embedding-model", default="all-MiniLM-L6-v2")
    parser.add_argument("--api-key", default="not-needed")
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.base_url}/v1", api_key=args.api_key, max_retries=0)
    cases = requests(client, args.model, args.embedding_model)
    worked = 0
    for name, call in cases.items():
        try:
            call()
            worked += 1
            print(f"ok    {name}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the list
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:160]}")
    headers = {"Authorization": f"Bearer {args.api_key}"}
    for method, path, body in (
        ("POST", "/tokenize", {"prompt": "Hello"}),
        ("POST", "/detokenize", {"tokens": [1, 2]}),
        ("GET", "/tokenizer_info", None),
        ("GET", "/metrics", None),
    ):
        status = httpx.request(method, args.base_url + path, json=body, headers=headers, timeout=30).status_code
        print(f"{'ok  ' if status == 200 else 'FAIL'}  {method} {path}: {status}")
    print(f"{worked} of {len(cases)} SDK requests worked")


if __name__ == "__main__":
    main()
