"""Tool calls per model family: format detection, the forcing grammars, and the incremental parser."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from tritonllm.engine.decoding.grammar import GrammarCompiler
from tritonllm.tokenizer.tool_calls import FORMATS, ToolCallParser, detect_format, with_tools_in_prompt

WEATHER = {"city": "Paris", "n": [1, {"a": "}"}]}
WRITTEN = {  # two calls in each family's own words, after some content
    "hermes": 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": %s}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": %s}; {"name": "add", "parameters": {"a": 1}}',
    "mistral": 'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": %s}, {"name": "add", "arguments": {"a": 1}}]',
    "json": '[{"name": "get_weather", "arguments": %s}, {"name": "add", "arguments": {"a": 1}}]',
}


def function(name: str, argument: str, schema: dict) -> dict:
    parameters = {"type": "object", "properties": {argument: schema}, "required": [argument]}
    return {"name": name, "parameters": {**parameters, "additionalProperties": False}}


FUNCTIONS = [
    function("get_weather", "city", {"type": "string", "maxLength": 8}),
    function("add", "a", {"type": "integer", "minimum": 0, "maximum": 9}),
]


def parse(
    fmt: str, text: str, piece: int, max_calls: int | None = None, cut_off: bool = False
) -> tuple[str, list[dict], list[dict]]:
    """Feeds `text` in pieces of `piece` characters; the content, the calls put together from deltas, and the
    parser's own list."""
    parser = ToolCallParser(FORMATS[fmt], max_calls)
    content, deltas, groups = "", [], []
    for start in range(0, len(text), piece):
        more, new = parser.feed(text[start : start + piece])
        content, deltas = content + more, deltas + new
        groups.append(new)
    more, new = parser.finish(cut_off)
    assert all(len({d["index"] for d in group}) == len(group) for group in groups + [new])  # one entry a call
    calls: dict[int, dict] = {}
    for delta in deltas + new:
        if "id" in delta:
            assert delta["index"] not in calls
            calls[delta["index"]] = {"name": delta["function"]["name"], "arguments": ""}
        calls[delta["index"]]["arguments"] += delta["function"]["arguments"]
    return content + more, [calls[i] for i in sorted(calls)], parser.tool_calls()


@pytest.mark.parametrize("fmt", list(WRITTEN))
@pytest.mark.parametrize("piece", [1, 3, 10_000])
def test_streamed_calls_equal_the_whole_parse(fmt, piece):
    text = WRITTEN[fmt] % json.dumps(WEATHER)
    content, streamed, whole = parse(fmt, text, piece)
    assert content == ("Sure.\n" if fmt == "hermes" else "Sure." if fmt == "mistral" else "")
    assert [c["name"] for c in streamed] == ["get_weather", "add"]
    assert json.loads(streamed[0]["arguments"]) == WEATHER
    assert streamed == [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in whole]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in whole)


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("json", "The capital is {Paris}."),
        ("json", '{"answer": 4}'),  # JSON, but no call
        ("json", "  \n"),
        ("hermes", "no call, only a <tool_ that never opens"),
        ("hermes", "<tool_call>\nnot json\n</tool_call>"),
        ("mistral", "[TOOL_CALLS] nothing"),
    ],
)
def test_text_without_calls_is_content_unchanged(fmt, text):
    for piece in (1, 4, 1000):
        content, streamed, whole = parse(fmt, text, piece)
        assert (content, streamed, whole) == (text, [], [])


def test_parallel_calls_off_keeps_the_first():
    _, streamed, whole = parse("json", WRITTEN["json"] % "{}", 2, max_calls=1)
    assert [c["name"] for c in streamed] == [c["function"]["name"] for c in whole] == ["get_weather"]


def test_a_call_cut_off_keeps_what_was_streamed():
    content, streamed, whole = parse("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', 3)
    assert content == ""
    assert streamed == [{"name": "get_weather", "arguments": '{"city": "Pa'}]
    assert whole[0]["function"]["arguments"] == '{"city": "Pa'


@pytest.mark.parametrize("text", ["<tool_call>", '<tool_call>\n{"na', '{"name": "get_w'])
def test_a_call_cut_off_before_its_name_leaves_no_markup_in_the_content(text):
    fmt = "json" if text.startswith("{") else "hermes"
    for piece in (1, 1000):
        assert parse(fmt, "Sure. " * (fmt == "hermes") + text, piece, cut_off=True)[:2] == (
            "Sure. " * (fmt == "hermes"),
            [],
        )
        assert parse(fmt, text, piece)[0] == text  # not cut off: what the model wrote was no call


def test_name_after_arguments_arrives_whole():
    _, streamed, _ = parse("json", '{"arguments": {"a": 2}, "name": "add"}', 2)
    assert streamed == [{"name": "add", "arguments": '{"a": 2}'}]


@pytest.fixture(scope="module")
def smollm2(request):
    from conftest import MODELS

    path = MODELS / "SmolLM2-135M-Instruct"
    if not (path / "config.json").exists():
        pytest.fail(f"{path} is missing: `make model` converts it (make test does)")
    return AutoTokenizer.from_pretrained(path)


def test_format_comes_from_the_chat_template(tokenizer, smollm2):
    assert detect_format(tokenizer).name == "hermes"  # the demo template renders Qwen-style <tool_call> tags
    assert detect_format(smollm2).name == "json"  # SmolLM2's renders no tools


def test_a_template_without_tools_gets_them_in_its_system_prompt(smollm2):
    call = {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "1"},
    ]
    tools = [{"type": "function", "function": FUNCTIONS[0]}]
    text = smollm2.apply_chat_template(with_tools_in_prompt(messages, tools, FORMATS["json"]), tokenize=False)
    assert text.startswith("<|im_start|>system\nYou can call these functions:\n")
    assert '"maxLength": 8' in text and '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in text


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("several", [False, True])
def test_forced_output_parses_into_valid_calls(fmt, several, tokenizer, smollm2):
    """Whatever the logits, output under a format's grammar parses into calls of the given functions, on a
    tokenizer that has the format's tags as special tokens (the demo's <tool_call>) and on one that lacks them."""
    for tok in (tokenizer, smollm2):
        grammar = GrammarCompiler(tok).matcher("lark", FORMATS[fmt].grammar(FUNCTIONS, several))
        g, out = torch.Generator().manual_seed(len(fmt)), []
        while not grammar.finished and len(out) < 200:
            token = int(grammar.mask(torch.randn(len(tok), generator=g) * 3).argmax())
            grammar.advance(token)
            out.append(token)
        assert grammar.finished
        _, streamed, _ = parse(fmt, tok.decode(out), 5)
        assert streamed and (several or len(streamed) == 1)
        for call in streamed:
            assert call["name"] in ("get_weather", "add") and isinstance(json.loads(call["arguments"]), dict)


def test_auto_grammar_lets_text_through_and_keeps_calls_valid(smollm2):
    compiler = GrammarCompiler(smollm2)
    lark = FORMATS["json"].grammar(FUNCTIONS, several=True, or_text=True)
    for start, finishes_as_call in (("The weather is fine.", False), ('{"name":"add","arguments":{"a":', True)):
        grammar = compiler.matcher("lark", lark)
        for token in smollm2.encode(start, add_special_tokens=False):
            grammar.advance(token)
        if finishes_as_call:
            masked = grammar.mask(torch.zeros(len(smollm2)))
            allowed = {smollm2.decode([t]) for t in torch.isfinite(masked).nonzero().flatten().tolist()}
            assert allowed and all(a.strip()[:1].isdigit() for a in allowed)  # only the integer a may follow


def test_call_schemas_close_objects_that_list_their_properties():
    nested = {
        "type": "object",
        "properties": {"p": {"type": "object", "properties": {"q": {"const": {"properties": 1}}}}},
    }
    open_map = {"type": "object", "additionalProperties": {"type": "integer"}}
    schema = FORMATS["json"].call_schema(
        {"name": "f", "parameters": {**nested, "properties": {**nested["properties"], "m": open_map}}}
    )
    arguments = schema["properties"]["arguments"]
    assert arguments["additionalProperties"] is False
    assert arguments["properties"]["p"]["additionalProperties"] is False
    assert arguments["properties"]["p"]["properties"]["q"] == {"const": {"properties": 1}}  # data stays as it is
    assert arguments["properties"]["m"] == open_map  # a schema that says otherwise keeps its word


def test_serve_detects_the_tool_call_format_once_then_reads_it_from_the_cache(tmp_path, monkeypatch):
    from conftest import MODELS

    from tritonllm.formats import hf_folder
    from tritonllm.formats.model_cache import CACHE_ENV
    from tritonllm.tokenizer.tool_calls import resolve_format_of

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    model = MODELS / "SmolLM2-135M-Instruct"
    expected = detect_format(AutoTokenizer.from_pretrained(model))
    assert resolve_format_of("auto", model) == expected

    def not_again(_):
        raise AssertionError("the tokenizer was loaded again")

    monkeypatch.setattr(hf_folder, "load_tokenizer", not_again)
    assert resolve_format_of("auto", model) == expected
    assert resolve_format_of("hermes", model) == FORMATS["hermes"]
