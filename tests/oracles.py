"""Expected outputs computed by transformers itself, independent of the engine under test."""

from __future__ import annotations

import torch

from tritonllm.tokenizer.detokenizer import CONTEXT_TOKENS, text_increment


def greedy_ids(hf_model, prompt_ids: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    out = hf_model.generate(
        torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    return out[0, len(prompt_ids) :].tolist()


def greedy_text(hf_model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> tuple[str, list[int]]:
    """What the ensemble should answer: generate() until the tokenizer's eos, decoded after the prompt."""
    ids = greedy_ids(hf_model, prompt_ids, max_new_tokens, eos=tokenizer.eos_token_id)
    return text_increment(tokenizer, prompt_ids[-CONTEXT_TOKENS:], ids, final=True), ids
