"""What vLLM's GET /tokenizer_info tells: enough for a client (lm-eval's remote tokenizer) to need no local copy."""

from __future__ import annotations

import json

SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")


def tokenizer_info(tokenizer, context_len: int, name_or_path: str = "") -> str:
    """JSON: the tokenizer's class, special tokens, chat template, the context it serves and the folder it comes
    from (`name_or_path`, as transformers names it)."""
    info = {
        "name_or_path": name_or_path,
        "tokenizer_class": getattr(tokenizer, "tokenizer_class", type(tokenizer).__name__),
        **{name: getattr(tokenizer, name) for name in SPECIAL},
        "chat_template": tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None,
        "model_max_length": context_len,
        "vocab_size": len(tokenizer),
    }
    return json.dumps(info, ensure_ascii=False)
