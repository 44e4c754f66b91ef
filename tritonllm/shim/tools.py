"""Tool calls: the grammar that forces them (tool_choice required or named), and parsing them from the text.

The chat template (Qwen-style, as the demo model's) asks for each call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. A forced call is decoded under a Lark grammar
whose call object is the JSON schema of the allowed functions, so it parses and validates whatever the weights.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)


def call_schema(function: dict[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def forcing_grammar(functions: list[dict[str, Any]], several: bool) -> str:
    """Lark for one call (or, with `several`, one or more) of any of `functions`."""
    schema = {"anyOf": [call_schema(f) for f in functions]} if len(functions) > 1 else call_schema(functions[0])
    schema["x-guidance"] = {"whitespace_flexible": False}
    calls = "call+" if several else "call"
    # The tags are single tokens of the tokenizer, named as such in llguidance's Lark.
    return f'start: {calls}\ncall: {OPEN} "\\n" body "\\n" {CLOSE}\nbody: %json {json.dumps(schema)}\n'


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """The text outside the calls, and the calls in OpenAI's shape; malformed calls stay in the text."""
    calls, kept, last = [], [], 0
    for match in _CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
            name, arguments = body["name"], body.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    kept.append(text[last:])
    return "".join(kept).strip() if calls else text, calls
