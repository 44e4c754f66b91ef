"""Tool calls in each model family's own format: which one a chat template uses, the grammar that forces a call,
and the parser that turns generated text into OpenAI tool calls, piece by piece while it streams.

- `hermes` (Qwen 2.5/3, Hermes, the demo models): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
  once per call.
- `llama3_json` (Llama 3.1-3.3): `{"name": ..., "parameters": {...}}`, maybe after `<|python_tag|>`.
- `mistral`: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`.
- `json` (templates that render no tools, or teach no format known here): `{"name": ..., "arguments": {...}}`, or
  an array of them, as the whole answer.

A chat template that renders no tools (SmolLM2's) gets them in its system prompt instead, with the `json` format
explained there (see `system_prompt`); a forced call is decoded under a grammar of that format, so it parses
whatever the weights, and no special token that the vocabulary lacks is ever named.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonllm.formats import model_cache

ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    opening: str | None  # the text that starts the calls; None: they stand alone at the start of the answer
    argument_key: str  # what this family names the arguments when it writes a call
    separators: tuple[str, ...]  # text that may stand around and between call objects, besides whitespace
    one_call: str  # Lark for one call, `body` being the call object
    # Whether `auto` decodes under a grammar too: the answer is free text, or, from its first character on, a
    # valid call. For templates that never taught the model a format (llama.cpp's lazy grammars do the same).
    guards_auto: bool = False

    def grammar(self, functions: list[dict[str, Any]], several: bool, or_text: bool = False) -> str:
        """Lark (llguidance's dialect) for one call, or with `several` one or more, of any of `functions`;
        `or_text`: or else any text that does not start like a call."""
        schema = {"anyOf": [self.call_schema(f) for f in functions]} if len(functions) > 1 else None
        schema = schema or self.call_schema(functions[0])
        schema["x-guidance"] = {"whitespace_flexible": False}
        start = _SEVERAL[self.name] if several else "start: call"
        lark = f"{start}\ncall: {self.one_call}\nbody: %json {json.dumps(schema)}\n"
        if or_text:
            lark = lark.replace("start: ", "start: TEXT | ", 1) + _TEXT_NOT_A_CALL
        return lark

    def call_schema(self, function: dict[str, Any]) -> dict[str, Any]:
        parameters = _closed(function.get("parameters") or {"type": "object", "properties": {}})
        return {
            "type": "object",
            "properties": {"name": {"const": function["name"]}, self.argument_key: parameters},
            "required": ["name", self.argument_key],
            "additionalProperties": False,
        }

    def example(self) -> str:
        call = f'{{"name": <function-name>, "{self.argument_key}": <arguments-json-object>}}'
        return {"hermes": f"<tool_call>\n{call}\n</tool_call>", "mistral": f"[TOOL_CALLS] [{call}]"}.get(
            self.name, call
        )


_VALUES = frozenset({"const", "enum", "default", "examples"})  # keywords that hold data, not schemas


def _closed(schema: Any) -> Any:
    """The schema with objects that list their properties closed to others, unless they say otherwise (as
    xgrammar's strict mode in vLLM): a small model under an open schema invents keys until max_tokens."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: value if key in _VALUES else _closed(value) for key, value in schema.items()}
    if "properties" in closed and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


FORMATS = {
    f.name: f
    for f in (
        ToolCallFormat(
            "hermes",
            "<tool_call>",
            "arguments",
            ("<tool_call>", "</tool_call>"),
            '"<tool_call>" "\\n" body "\\n" "</tool_call>"',
        ),
        ToolCallFormat("llama3_json", "<|python_tag|>", "parameters", (";",), "body"),
        ToolCallFormat("mistral", "[TOOL_CALLS]", "arguments", ("[", "]", ","), '"[TOOL_CALLS]" "[" body "]"'),
        ToolCallFormat("json", None, "arguments", ("[", "]", ","), "body", guards_auto=True),
    )
}
_SEVERAL = {
    "hermes": 'start: call ("\\n" call)*',
    "llama3_json": 'start: call (";" call)*',
    "mistral": 'start: "[TOOL_CALLS]" "[" body ("," body)* "]"',
    "json": 'start: call | "[" body ("," body)* "]"',
}
# Text whose first non-space character cannot start a call of the `json` format.
_TEXT_NOT_A_CALL = "TEXT: /\\s*[^{\\[\\s][\\s\\S]*/\n"
# An answer that starts with one of these may be a call, in the formats whose calls stand alone.
_BARE_OPENINGS = {"llama3_json": "{", "json": "{["}
PROBE_TOOL = {"type": "function", "function": {"name": "tritonllm_probe_tool", "parameters": {"type": "object"}}}


def renders_tools(tokenizer) -> bool:
    """Whether the chat template puts the tools it is given into the prompt."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[PROBE_TOOL], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that breaks on tools renders none
        return False
    return PROBE_TOOL["function"]["name"] in text


def detect_format(tokenizer) -> ToolCallFormat:
    """The format the model's chat template teaches; `json` where it renders no tools or names no known one."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if renders_tools(tokenizer):
        for marker, name in (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json")):
            if marker in template:
                return FORMATS[name]
    return FORMATS["json"]


def resolve_format(name: str, tokenizer=None) -> ToolCallFormat:
    """`auto` (detected from the tokenizer's chat template) or one of FORMATS by name."""
    if name == "auto":
        if tokenizer is None:
            raise ValueError("tool_call_parser 'auto' needs the model's tokenizer")
        return detect_format(tokenizer)
    if name not in FORMATS:
        raise ValueError(f"tool_call_parser must be 'auto' or one of {sorted(FORMATS)}, got {name!r}")
    return FORMATS[name]


def resolve_format_of(name: str, model_dir: Path) -> ToolCallFormat:
    """resolve_format for a model directory; `auto` is detected once and then read from the model cache, so that
    `serve` need not load the tokenizer through transformers on every start."""
    if name != "auto":
        return resolve_format(name)
    name = model_cache.detected_name(model_dir, "tool_format", Path(__file__), FORMATS, lambda t: detect_format(t).name)
    return FORMATS[name]


def system_prompt(tools: list[dict[str, Any]], fmt: ToolCallFormat) -> str:
    """Tools explained in words, for a chat template that renders none."""
    listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return (
        f"You can call these functions:\n{listed}\n\n"
        f"To call a function, answer with nothing but the call, written as {fmt.example()}. "
        "Otherwise answer the user directly."
    )


def with_tools_in_prompt(messages: list[dict], tools: list[dict], fmt: ToolCallFormat) -> list[dict]:
    """The conversation for a template without tools: the tools in the system message, earlier calls as text."""
    out = [dict(m) for m in messages]
    for message in out:
        calls = message.pop("tool_calls", None)
        if calls:
            written = [{"name": c["function"]["name"], fmt.argument_key: c["function"]["arguments"]} for c in calls]
            text = json.dumps(written[0] if len(written) == 1 else written, ensure_ascii=False)
            message["content"] = "\n".join(filter(None, [message.get("content"), text]))
    prompt = system_prompt(tools, fmt)
    if out and out[0]["role"] in ("system", "developer"):
        out[0]["content"] = f"{out[0]['content']}\n\n{prompt}"
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out


@dataclass
class _Call:
    id: str
    start: int  # where its object starts in the text
    name: str | None = None
    arguments_start: int | None = None
    arguments: str = ""  # as handed out so far; the model's own JSON text once the object is complete
    complete: bool = False


# A call object's head when the name comes first, up to where its arguments' value starts.
_NAME_FIRST = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)')


@dataclass
class ToolCallParser:
    """Splits generated text into content and tool calls, incrementally.

    `feed()` returns the new content and OpenAI-shaped tool-call deltas: a call's id and name first, then its
    arguments in pieces, exactly the JSON text the model wrote; `finish()` ends the text. The same parser
    serves whole responses (fed everything at once), so the joined stream equals the whole answer.
    """

    format: ToolCallFormat
    max_calls: int | None = None  # parallel_tool_calls false: 1
    text: str = ""
    calls: list[_Call] = field(default_factory=list)
    _sent: int = 0  # characters of text handed out as content
    _scan: int | None = None  # where the next call may start; None: no call has begun
    _closed: bool = False  # no more calls: junk, or max_calls reached

    def feed(self, piece: str) -> tuple[str, list[dict]]:
        self.text += piece
        content = self._content(final=False)
        return content, _merged(self._parse()) if self._scan is not None else []

    def finish(self, cut_off: bool = False) -> tuple[str, list[dict]]:
        """The rest: a call region with no named call goes back to the content, as the model wrote it, unless
        the length limit cut it off (`cut_off`): then it was a call's start, and its markup is no answer."""
        content = self._content(final=True)
        deltas = _merged(self._parse()) if self._scan is not None else []
        if self._scan is not None and not cut_off and not any(c.name for c in self.calls):
            content += self.text[self._sent :]
            self._sent = len(self.text)
        return content, deltas

    @property
    def has_complete_call(self) -> bool:
        return any(c.complete for c in self.calls)

    def tool_calls(self) -> list[dict]:
        """The calls in OpenAI's message shape, as streamed: one cut off by the length limit keeps its start."""
        return [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in self.calls
            if c.name is not None
        ]

    def _content(self, final: bool) -> str:
        """Text before the calls; a possible start of the opening is held back until it is told apart."""
        if self._scan is not None:
            return ""
        rest = self.text[self._sent :]
        bare = _BARE_OPENINGS.get(self.format.name)
        if bare and not self.text[: self._sent].strip():
            stripped = rest.lstrip()
            if stripped and stripped[0] in bare:
                self._scan = self._sent + len(rest) - len(stripped)
                return ""
            if not stripped and not final:
                return ""  # only whitespace so far: a call may still follow
        opening = self.format.opening
        if opening:
            at = rest.find(opening)
            if at >= 0:
                self._scan = self._sent + at
                self._sent += at
                return rest[:at]
            if not final:
                rest = rest[: len(rest) - _partial_suffix(rest, opening)]
        self._sent += len(rest)
        return rest

    def _parse(self) -> list[dict]:
        deltas: list[dict] = []
        while not self._closed:
            position = self._skip_separators(self._scan)
            if position is None:  # a separator is still arriving
                break
            self._scan = position
            if position >= len(self.text):
                break
            if self.text[position] != "{":
                self._closed = True
                break
            if not self.calls or self.calls[-1].complete:
                if self.max_calls is not None and len(self.calls) >= self.max_calls:
                    self._closed = True
                    break
                self.calls.append(_Call(id=f"call_{uuid.uuid4().hex[:24]}", start=position))
            call = self.calls[-1]
            end = self._complete(call, deltas)
            if end is None:
                self._stream_arguments(call, deltas)
                break
            self._scan = end
        return deltas

    def _skip_separators(self, position: int) -> int | None:
        text = self.text
        tokens = sorted((*self.format.separators, *filter(None, [self.format.opening])), key=len, reverse=True)
        while position < len(text):
            if text[position].isspace():
                position += 1
                continue
            token = next((t for t in tokens if text.startswith(t, position)), None)
            if token is None:
                rest = text[position:]
                return None if any(t.startswith(rest) for t in tokens) else position
            position += len(token)
        return position

    def _complete(self, call: _Call, deltas: list[dict]) -> int | None:
        """Where the call's object ends, once it is whole and names a function; its unsent parts go out."""
        try:
            body, end = _DECODER.raw_decode(self.text, call.start)
        except json.JSONDecodeError:
            return None
        key = next((k for k in ARGUMENT_KEYS if isinstance(body, dict) and k in body), None)
        if key is None or not isinstance(body.get("name"), str):
            self.calls.pop()
            self._closed = True
            return len(self.text)
        if call.arguments_start is None and _NAME_FIRST.match(self.text, call.start) is None:
            # the name came after the arguments, so nothing was streamed: the arguments go out whole
            self._announce(call, body["name"], deltas)
            self._send(call, json.dumps(body[key], ensure_ascii=False), deltas)
        else:
            self._stream_arguments(call, deltas)
        call.complete = True
        return end

    def _stream_arguments(self, call: _Call, deltas: list[dict]) -> None:
        if call.arguments_start is None:
            head = _NAME_FIRST.match(self.text, call.start)
            if head is None:
                return
            call.arguments_start = head.end()
            self._announce(call, json.loads(f'"{head.group(1)}"'), deltas)
        try:  # arguments already whole: exactly their text; else all of the text so far is arguments
            _, end = _DECODER.raw_decode(self.text, call.arguments_start)
        except json.JSONDecodeError:
            end = len(self.text)
        self._send(call, self.text[call.arguments_start + len(call.arguments) : end], deltas)

    def _send(self, call: _Call, piece: str, deltas: list[dict]) -> None:
        if piece:
            call.arguments += piece
            deltas.append({"index": self.calls.index(call), "function": {"arguments": piece}})

    def _announce(self, call: _Call, name: str, deltas: list[dict]) -> None:
        call.name = name
        deltas.append(
            {
                "index": self.calls.index(call),
                "id": call.id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
        )


_DECODER = json.JSONDecoder()


def _merged(deltas: list[dict]) -> list[dict]:
    """One entry per call in a chunk, as OpenAI sends them: a call's pieces from one feed joined."""
    out: list[dict] = []
    for delta in deltas:
        if out and out[-1]["index"] == delta["index"]:
            out[-1]["function"]["arguments"] += delta["function"]["arguments"]
        else:
            out.append(delta)
    return out


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
