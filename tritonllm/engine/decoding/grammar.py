"""Grammar-constrained decoding with llguidance: each constrained sequence has a matcher that masks its logits
to the tokens the grammar allows next and advances on every token the sequence takes.

Guide types follow TensorRT-LLM's `guided_decoding_guide_type`: "json" (any JSON object), "json_schema",
"regex" and "lark" (llguidance's Lark dialect, which can embed JSON schemas with `%json {...}` and name
special tokens as `<[id]>`). JSON is generated compact (no free whitespace), so that even a model that has
not learnt JSON finishes its objects in few tokens.
"""

from __future__ import annotations

import json
import re

import llguidance
import llguidance.numpy
import numpy as np
import torch

from tritonllm.common.errors import RequestError

GUIDE_TYPES = ("json", "json_schema", "regex", "lark")
COMPACT_JSON = {"whitespace_flexible": False}


class GrammarCompiler:
    """Built once per model from its tokenizer."""

    def __init__(self, tokenizer) -> None:
        import llguidance.hf  # imports transformers (26 MB): only where guided decoding is asked for

        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        # llguidance never matches a special token against text, so a Lark string that spells one (a tool-call
        # tag such as Qwen's "<tool_call>") is read as that token: grammars need not know the vocabulary.
        self.special_tokens = {
            text: token
            for text, token in tokenizer.get_added_vocab().items()
            if token < self.tokenizer.vocab_size and self.tokenizer.is_special_token(token)
        }

    def matcher(self, guide_type: str, guide: str) -> Grammar:
        """Raises ValueError naming the guided_decoding tensors when the guide is not valid."""
        if guide_type not in GUIDE_TYPES:
            raise RequestError(
                "guided_decoding_guide_type",
                f"guided_decoding_guide_type must be one of {list(GUIDE_TYPES)}, got {guide_type!r}",
            )
        try:
            if guide_type == "json":
                grammar = llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', COMPACT_JSON)
            elif guide_type == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(json.loads(guide), COMPACT_JSON)
            elif guide_type == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(guide)
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(self._special_tokens_named(guide))
        except (ValueError, TypeError) as e:
            raise RequestError(
                "guided_decoding_guide", f"guided_decoding_guide is not a valid {guide_type}: {e}"
            ) from e
        matcher = llguidance.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise RequestError(
                "guided_decoding_guide", f"guided_decoding_guide is not a valid {guide_type}: {matcher.get_error()}"
            )
        return Grammar(matcher, self.tokenizer.vocab_size)

    def _special_tokens_named(self, lark: str) -> str:
        """`"<tool_call>"` -> `<[id]>` where that string is one special token; JSON after `%json` stays as it is."""

        def token(match: re.Match) -> str:
            found = self.special_tokens.get(json.loads(match.group(0)))
            return match.group(0) if found is None else f"<[{found}]>"

        lines = []
        for line in lark.splitlines():
            rules, json_mark, schema = line.partition("%json")
            lines.append(_LARK_STRING.sub(token, rules) + json_mark + schema)
        return "\n".join(lines)


_LARK_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


class Grammar:
    """One sequence's matcher."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        # (llguidance.torch would import torch's compiler, which the Python backend's stub cannot load)
        self._bitmask = llguidance.numpy.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of `logits` [vocab] with the tokens the grammar forbids at -inf."""
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self._bitmask, 0)
        allowed = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")[: self.vocab_size]
        keep = torch.zeros(len(logits), dtype=torch.bool, device=logits.device)
        keep[: self.vocab_size] = torch.from_numpy(allowed.astype(bool)).to(logits.device)
        return logits.masked_fill(~keep, float("-inf"))

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"grammar rejected token {token}: {self.matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar is complete and allows nothing more."""
        return self.matcher.is_stopped()
