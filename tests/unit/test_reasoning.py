"""Reasoning models' thinking apart from their answer (tritonllm/tokenizer/reasoning.py): the split of whole and
streamed text, the tokens counted as thinking, and the format read from a chat template."""

from __future__ import annotations

import random

import pytest
from thinking_models import thinking_model

from tritonllm.formats.hf_folder import load_tokenizer
from tritonllm.tokenizer.reasoning import CLOSING, FORMATS, OPENING, ReasoningParser, detect_format, split

ANSWERS = [
    "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.",
    "<think></think>Just the answer",
    "<think>never closed, cut by max_tokens",
    "No thinking at all, and a </think> in the middle stays content",
    "<thin but not a tag",
    "<think>a < b and </thin is not the end</think>answer with <think> in it",
    "",
    "<",
    "\n<think>after a newline: content</think>",
    "思考 🙂 <think>é</think>ü",
]


def joined(reasoning: str, content: str, text: str, starts_open: bool) -> str:
    """The model's text put back together: the tags the split dropped, where they stood."""
    opening = OPENING if not starts_open and text.startswith(OPENING) else ""
    inside = starts_open or opening
    closing = CLOSING if inside and CLOSING in text[len(opening) :] else ""
    return opening + reasoning + closing + content


@pytest.mark.parametrize("starts_open", [False, True])
def test_every_character_lands_in_reasoning_or_content_in_order(starts_open):
    for text in ANSWERS:
        reasoning, content = split(text, starts_open)
        assert joined(reasoning, content, text, starts_open) == text, text


def test_the_split_of_known_answers():
    assert split(ANSWERS[0], False) == ("\nLet me see: 2+2.\n", "\n\nIt is 4.")
    assert split(ANSWERS[2], False) == ("never closed, cut by max_tokens", "")
    assert split(ANSWERS[3], False) == ("", ANSWERS[3])
    assert split("Reasoning first.</think>Then the answer", True) == ("Reasoning first.", "Then the answer")
    assert split("no end tag", True) == ("no end tag", "")
    assert split(ANSWERS[5], False) == ("a < b and </thin is not the end", "answer with <think> in it")


@pytest.mark.parametrize("starts_open", [False, True])
def test_streamed_pieces_split_as_the_whole_text(starts_open):
    rng = random.Random(0)
    for text in ANSWERS:
        for _ in range(50):
            cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            parser = ReasoningParser(starts_open)
            parts = [parser.feed(piece) for piece in pieces] + [parser.finish()]
            streamed = ("".join(r for r, _ in parts), "".join(c for _, c in parts))
            assert streamed == split(text, starts_open), (text, pieces)


def test_thinking_tokens_are_those_read_inside_the_block_tags_included():
    def count(tokens: list[str], starts_open: bool = False) -> int:
        parser = ReasoningParser(starts_open)
        for token in tokens:
            parser.feed(token, 1)
        parser.finish()
        return parser.reasoning_tokens

    assert count(["<th", "ink>", "a", "b", "</think>", "\n", "answer"]) == 5
    assert count(["<th", "e", " answer"]) == 0  # what looked like a tag was the answer's start
    assert count(["plain", " answer"]) == 0
    assert count(["a", "b", "</", "think>", "c"], starts_open=True) == 4
    assert count(["<think>ab</think>c"]) == 1  # one piece that opens and closes the block


def test_the_format_comes_from_the_chat_template(tmp_path, tiny_model_dir):
    assert detect_format(load_tokenizer(tiny_model_dir)) == "none"
    for style in ("qwen3", "deepseek_r1"):
        model = thinking_model(tiny_model_dir, tmp_path / style, style)
        assert detect_format(load_tokenizer(model)) == style


def test_a_request_that_turns_thinking_off_starts_outside_the_block():
    r1, qwen3 = FORMATS["deepseek_r1"], FORMATS["qwen3"]
    assert r1.opens_answer(None) and r1.opens_answer({"enable_thinking": True})
    assert not r1.opens_answer({"enable_thinking": False}) and not r1.opens_answer({"thinking": False})
    assert not qwen3.opens_answer(None) and not qwen3.opens_answer({"enable_thinking": True})


def test_the_servers_budget_applies_where_the_chat_gives_none_and_the_model_thinks():
    from tritonllm.shim.errors import APIError
    from tritonllm.shim.openai_protocol import ChatRequest
    from tritonllm.shim.serving_chat import thinking_budget
    from tritonllm.shim.settings import ShimSettings

    def chat(**fields) -> ChatRequest:
        return ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)

    server = ShimSettings(reasoning_parser="qwen3", reasoning_budget=64)
    assert thinking_budget(chat(), server, thinks=True) == 64
    assert thinking_budget(chat(max_thinking_tokens=5), server, thinks=True) == 5
    assert thinking_budget(chat(), server, thinks=False) is None  # a model that does not think: no default
    assert thinking_budget(chat(), ShimSettings(reasoning_parser="qwen3"), thinks=True) is None
    with pytest.raises(APIError) as refused:  # asked for by the request: never dropped silently
        thinking_budget(chat(max_thinking_tokens=5), server, thinks=False)
    assert refused.value.param == "max_thinking_tokens"
