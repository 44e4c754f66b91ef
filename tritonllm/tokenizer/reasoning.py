"""Reasoning models' thinking, told apart from their answer: which format a chat template uses, and the parser
that splits generated text into reasoning and content, piece by piece while it streams.

Both formats known here (vLLM's `deepseek_r1` and `qwen3` parsers, llama.cpp's `--reasoning-format deepseek`)
write the thinking between `<think>` and `</think>`, then the answer:

- `qwen3`: the model opens the block itself (`<think>` is the answer's first text). A template switched out of
  thinking (Qwen3's `enable_thinking: false`) writes an empty block into the prompt, and the answer is all content.
- `deepseek_r1`: the template's generation prompt opens the block (`...<｜Assistant｜><think>\\n`), so the answer
  starts inside it and only `</think>` shows where the thinking ends. A request that turns thinking off in
  `chat_template_kwargs` (`enable_thinking` or `thinking` false) starts outside it.

The tags themselves go to neither part; everything else goes to exactly one, in order, so the opening tag (when
the model wrote it), the reasoning, the closing tag and the content joined are the model's text byte for byte.
A block never closed (cut by max_tokens) is all reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonllm.formats import model_cache
from tritonllm.tokenizer.tool_calls import PROBE_TOOL

OPENING, CLOSING = "<think>", "</think>"
THINKING_SWITCHES = ("enable_thinking", "thinking")  # chat_template_kwargs that templates read to turn it off


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    starts_open: bool  # the template's generation prompt opens the block: the answer starts inside it

    def opens_answer(self, chat_template_kwargs: dict[str, Any] | None) -> bool:
        """Whether a request's answer starts inside the block."""
        switches = chat_template_kwargs or {}
        return self.starts_open and all(switches.get(name, True) is not False for name in THINKING_SWITCHES)


FORMATS = {f.name: f for f in (ReasoningFormat("qwen3", False), ReasoningFormat("deepseek_r1", True))}
NONE = "none"


def answer_starts_inside(parser: str, chat_template_kwargs: dict[str, Any] | None) -> bool | None:
    """Whether a request's answer starts inside the thinking block, under the reasoning parser named; None where
    the parser is `none` (the model does not think)."""
    thinking = FORMATS.get(parser)
    return None if thinking is None else thinking.opens_answer(chat_template_kwargs)


def detect_format(tokenizer) -> str:
    """`deepseek_r1` where the template's generation prompt leaves `<think>` open, `qwen3` where the template
    otherwise writes think tags, else `none`."""
    template = tokenizer.chat_template
    sources = template.values() if isinstance(template, dict) else [template or ""]
    if not any(CLOSING in source for source in sources):
        return NONE
    question = PROBE_TOOL["function"]["name"]
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that cannot render the probe: the model's own tags, outside the prompt
        return "qwen3"
    return "deepseek_r1" if leaves_block_open(text[text.rfind(question) + len(question) :]) else "qwen3"


def leaves_block_open(prompt: str) -> bool:
    """Whether the answer to `prompt` starts inside a thinking block (the prompt opened one last)."""
    return prompt.rfind(OPENING) > prompt.rfind(CLOSING)


def resolve_format(name: str, tokenizer=None) -> ReasoningFormat | None:
    """`auto` (detected from the tokenizer's chat template), `none`, or one of FORMATS by name."""
    if name == "auto":
        if tokenizer is None:
            raise ValueError("reasoning_parser 'auto' needs the model's tokenizer")
        name = detect_format(tokenizer)
    if name == NONE:
        return None
    if name not in FORMATS:
        raise ValueError(f"reasoning_parser must be auto, none or one of {sorted(FORMATS)}, got {name!r}")
    return FORMATS[name]


def resolve_format_of(name: str, model_dir: Path) -> ReasoningFormat | None:
    """resolve_format for a model directory, `auto` detected once and then read from the model cache."""
    if name == "auto":
        name = model_cache.detected_name(model_dir, "reasoning_format", Path(__file__), {*FORMATS, NONE}, detect_format)
    return resolve_format(name)


class ReasoningParser:
    """Generated text -> (reasoning, content), fed piece by piece. Text that may be the start of a tag is held
    back until the next piece tells. `reasoning_tokens` counts the tokens of the pieces read inside the block,
    its tags included."""

    def __init__(self, starts_open: bool) -> None:
        self.state = "reasoning" if starts_open else "start"
        self.held = ""
        self.reasoning_tokens = 0
        self._undecided_tokens = 0  # of the pieces read before the answer's start told whether it thinks

    def feed(self, text: str, tokens: int = 0) -> tuple[str, str]:
        before = self.state
        reasoning, content, opened = self._split(text)
        if self.state == "start":
            self._undecided_tokens += tokens
            return reasoning, content
        if before == "reasoning" or self.state == "reasoning" or opened:
            self.reasoning_tokens += self._undecided_tokens + tokens
        self._undecided_tokens = 0
        return reasoning, content

    def _split(self, text: str) -> tuple[str, str, bool]:
        """(reasoning, content, whether this text opened the block)"""
        text, self.held, opened = self.held + text, "", False
        reasoning = ""
        if self.state == "start":
            if OPENING.startswith(text):  # all of it may still be the opening tag
                self.held = text
                return "", "", False
            if text.startswith(OPENING):
                self.state, opened, text = "reasoning", True, text[len(OPENING) :]
            else:
                self.state = "content"
        if self.state == "reasoning":
            end = text.find(CLOSING)
            if end < 0:
                kept = _tag_prefix_at_end(text, CLOSING)
                reasoning, self.held = text[: len(text) - kept], text[len(text) - kept :]
                return reasoning, "", opened
            self.state, reasoning, text = "content", text[:end], text[end + len(CLOSING) :]
        return reasoning, text, opened

    def finish(self) -> tuple[str, str]:
        """What was held back, once no more text comes."""
        held, self.held = self.held, ""
        return (held, "") if self.state == "reasoning" else ("", held)


class ThinkingSplit:
    """A streamed answer's pieces -> (reasoning, content) by their text, and the thinking's tokens counted from
    each token's own text: a piece's text may lag its tokens (the detokenizer holds back an unfinished
    character), so a piece that holds the end of the thinking would count the wrong side's tokens."""

    def __init__(self, starts_open: bool) -> None:
        self.text = ReasoningParser(starts_open)
        self.tokens = ReasoningParser(starts_open)

    def feed(self, text: str, token_texts: list[str], num_tokens: int, final: bool) -> tuple[str, str]:
        """A piece of `num_tokens` tokens; `token_texts` each one's text (empty: unknown, the piece's tokens are
        counted on the side its text falls); `final`: the last piece, after which held-back text is let out."""
        for token in token_texts:
            self.tokens.feed(token, 1)
        if not token_texts:
            self.tokens.feed(text, num_tokens)
        reasoning, content = self.text.feed(text)
        if final:
            thought, said = self.text.finish()
            reasoning, content = reasoning + thought, content + said
        return reasoning, content

    @property
    def reasoning_tokens(self) -> int:
        return self.tokens.reasoning_tokens


def split(text: str, starts_open: bool) -> tuple[str, str]:
    """A whole answer's (reasoning, content)."""
    parser = ReasoningParser(starts_open)
    reasoning, content = parser.feed(text)
    more_reasoning, more_content = parser.finish()
    return reasoning + more_reasoning, content + more_content


def _tag_prefix_at_end(text: str, tag: str) -> int:
    """The length of the longest end of `text` that starts `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
