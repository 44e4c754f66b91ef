"""The model's tokenizer for the preprocessing and postprocessing models, without transformers' tokenizer classes
(nor torch) after the first start.

Loading a tokenizer through transformers imports transformers' model code and torch: 3.5 s of CPU and 340 MB in
every process that does it, and at a server's start several Python models do it at once on the same cores. Where
transformers' tokenizer is exactly its `tokenizers` backend plus a chat template (a fast tokenizer whose class
overrides none of the methods used here), the first load writes a snapshot of it to a cache file: the backend
as transformers configured it, the chat template, the special tokens. Later starts read the snapshot with
`tokenizers` and render the template with transformers' own renderer (`transformers.utils`, which imports neither
torch nor model code), so that ids and text are transformers' byte for byte. A snapshot is written only after it
encoded and rendered probes as transformers did; other tokenizers stay transformers' own. The file is kept as
model_cache.py keeps it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonllm.common.memory import release_free_memory
from tritonllm.formats import model_cache
from tritonllm.formats.hf_folder import load_tokenizer
from tritonllm.tokenizer.tool_calls import PROBE_TOOL

SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")
_PROBE_TEXTS = ("Hello world", " leading space\n\ttabs  and  runs", "éè 中文 🙂")


class BackendTokenizer:
    """What preprocessing and postprocessing ask of a tokenizer, answered by the `tokenizers` backend."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(snapshot["backend"])
        release_free_memory()
        # transformers turns these off for every call that does not ask for them
        self.backend.no_truncation()
        self.backend.no_padding()
        self.backend.encode_special_tokens = snapshot["split_special_tokens"]
        self.tokenizer_class = snapshot["tokenizer_class"]
        self.chat_template = snapshot["chat_template"]
        self.special_tokens_map = snapshot["special_tokens_map"]
        for name in SPECIAL:
            setattr(self, name, snapshot[name])
            setattr(self, f"{name}_id", snapshot[f"{name}_id"])

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, clean_up_tokenization_spaces=False) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("the backend decodes without transformers' clean-up of spaces")
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    def apply_chat_template(
        self,
        conversation: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        return_dict: bool = True,
        chat_template: str | None = None,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> str | list[int] | dict[str, list[int]]:
        """transformers' apply_chat_template for one conversation, with its defaults for everything not named;
        `template_kwargs` reach the template as variables (as transformers', overriding the special tokens)."""
        from transformers.utils.chat_template_utils import render_jinja_template

        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        # as transformers does: a key whose value is None is left out
        conversation = [{k: v for k, v in message.items() if v is not None} for message in conversation]
        (text,), _ = render_jinja_template(
            conversations=[conversation],
            tools=tools,
            chat_template=self._template(tools, chat_template),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **{**self.special_tokens_map, **template_kwargs},
        )
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids} if return_dict else ids

    def _template(self, tools: list[dict] | None, given: str | None = None) -> str:
        """transformers' get_chat_template: `given` is a template, or the name of one of the model's."""
        template = self.chat_template
        if isinstance(template, dict):
            if given is not None:
                return template.get(given, given)
            if tools is not None and "tool_use" in template:
                return template["tool_use"]
            if "default" in template:
                return template["default"]
            raise ValueError(f"This model has several chat templates and none is the default: {sorted(template)}")
        if given is not None:
            return given
        if template is None:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")
        return template


def load_backend_tokenizer(model_dir: Path):
    """The model's tokenizer: from the snapshot when there is one, else transformers' (and the snapshot written
    for next time, where the backend serves it exactly)."""
    cached = _snapshot_file(model_dir)
    if cached.is_file():
        return BackendTokenizer(json.loads(cached.read_text(encoding="utf-8")))
    tokenizer = load_tokenizer(model_dir)
    state = snapshot(tokenizer)
    if state is not None:
        model_cache.write(cached, json.dumps(state, ensure_ascii=False))
    return tokenizer


def cached_snapshot(model_dir: Path) -> str | None:
    """The snapshot's JSON as load_backend_tokenizer wrote it, for a process without the model's files (the
    shim); None where the tokenizer is transformers' own."""
    cached = _snapshot_file(model_dir)
    return cached.read_text(encoding="utf-8") if cached.is_file() else None


def _snapshot_file(model_dir: Path) -> Path:
    return model_cache.cached_file(model_dir, "backend_tokenizer.json", derived_by=Path(__file__))


def snapshot(tokenizer) -> dict[str, Any] | None:
    """What BackendTokenizer needs of a transformers tokenizer; None where it would not serve it exactly."""
    if not served_by_backend(tokenizer):
        return None
    state = {
        "backend": tokenizer.backend_tokenizer.to_str(),
        "tokenizer_class": type(tokenizer).__name__,
        "chat_template": tokenizer.chat_template,
        "special_tokens_map": tokenizer.special_tokens_map,
        "split_special_tokens": bool(tokenizer.split_special_tokens),
        **{name: getattr(tokenizer, name) for name in SPECIAL},
        **{f"{name}_id": getattr(tokenizer, f"{name}_id") for name in SPECIAL},
    }
    return state if _same_on_probes(BackendTokenizer(state), tokenizer) else None


def served_by_backend(tokenizer) -> bool:
    """Whether the tokenizer's class is transformers' backend tokenizer in every method BackendTokenizer stands in
    for (a subclass that overrides one of them is served by transformers)."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase as Base
    from transformers.tokenization_utils_tokenizers import TokenizersBackend as Backend

    if not isinstance(tokenizer, Backend):
        return False
    kind = type(tokenizer)
    inherited = {
        Base: ("decode", "encode", "__call__", "apply_chat_template", "get_chat_template"),
        Backend: ("_decode", "_encode_plus", "convert_ids_to_tokens", "__len__"),
    }
    return all(getattr(kind, name) is getattr(base, name) for base, names in inherited.items() for name in names)


def _same_on_probes(candidate: BackendTokenizer, tokenizer) -> bool:
    for text in _PROBE_TEXTS:
        for special in (True, False):
            if candidate.encode(text, special) != tokenizer.encode(text, add_special_tokens=special):
                return False
    if tokenizer.chat_template is None:
        return True
    conversation = [{"role": "system", "content": "s"}, {"role": "user", "content": _PROBE_TEXTS[2]}]
    for tools in (None, [PROBE_TOOL]):
        try:
            expected = tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True)
        except Exception:  # a template that breaks on a probe: not judged by it
            continue
        try:
            got = candidate.apply_chat_template(conversation, tools=tools, add_generation_prompt=True)
        except Exception:
            return False
        if got["input_ids"] != list(expected["input_ids"]):
            return False
    return True
