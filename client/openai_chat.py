"""Chat through the shim with the official OpenAI SDK, streamed and whole.

python client/openai_chat.py "Hello! 你好" --model SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("message")
    parser.add_argument("--base-url", default="http://127.0.0.1:9000/v1")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="not-needed")
    messages = [{"role": "user", "content": args.message}]

    print("stream: ", end="")
    for chunk in client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=args.max_tokens, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()

    reply = client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=args.max_tokens, temperature=0
    )
    print("whole:  " + reply.choices[0].message.content)
    print(f"finish_reason={reply.choices[0].finish_reason} usage={reply.usage}")


if __name__ == "__main__":
    main()
