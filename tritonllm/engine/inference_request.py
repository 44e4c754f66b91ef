"""TensorRT-LLM's InferenceRequest tensors -> the engine's prompt and SamplingParams.

Kept free of Triton so it is tested directly; the `llm` model hands in a lookup of its input tensors.
Every error names the tensor it is about.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import RequestError
from ..tokenizer.word_lists import decode_word_list
from .sampling_params import NO_END_ID, SamplingParams
from .sequence import DEFAULT_PRIORITY, HIGHEST_PRIORITY, LOWEST_PRIORITY

UINT64_MAX = (1 << 64) - 1
MAX_TOP_LOG_PROBS = 20
MAX_SAMPLES = 64
MAX_BEAM_WIDTH = 16
# early_stopping tensor values -> transformers' setting (see beam_search.py)
EARLY_STOPPING = {1: True, 0: False, -1: "never"}

TensorLookup = Callable[[str], "np.ndarray | None"]


@dataclass(frozen=True)
class ParsedRequest:
    prompt_ids: list[int]
    params: SamplingParams
    streaming: bool
    priority: int
    timeout_s: float | None  # from the request's start
    num_samples: int  # results returned: samples, or with beam_width > 1 the best beams
    draft_tokens: list[int]
    draft_logits: torch.Tensor | None
    prompt_table: torch.Tensor | None  # [prompt_vocab_size, hidden] for ids from the vocabulary size on
    guide: tuple[str, str] | None  # (guided_decoding_guide_type, guided_decoding_guide)
    include_stop_words: bool  # false: a final stop word's tokens are left out of the response
    skip_special_tokens: bool  # handed on to the detokenizer
    stream_interval: int | None  # new tokens per streamed response; None: the model's stream_interval


def scalar(get: TensorLookup, name: str, default=None):
    array = get(name)
    if array is None:
        return default
    if array.size != 1:
        raise RequestError(name, f"{name} must hold exactly one value, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value  # strings arrive as bytes


def is_stop_request(get: TensorLookup) -> bool:
    return bool(scalar(get, "stop", False))


def parse(get: TensorLookup, vocab_size: int, triton_timeout_us: int = 0, hidden_size: int = 0) -> ParsedRequest:
    """`triton_timeout_us`: the request's own Triton timeout, used when no `timeout_ms` tensor is given.
    `hidden_size`: the model's, which a p-tuning table must match."""
    priority = int(scalar(get, "priority", DEFAULT_PRIORITY))
    _check("priority", priority, HIGHEST_PRIORITY <= priority <= LOWEST_PRIORITY, "in [1, 5] (1 highest)")
    timeout_ms = scalar(get, "timeout_ms")
    if timeout_ms is not None:
        _check("timeout_ms", timeout_ms, timeout_ms > 0, "> 0")
    timeout_s = timeout_ms / 1e3 if timeout_ms is not None else (triton_timeout_us / 1e6 if triton_timeout_us else None)
    samples = scalar(get, "num_return_sequences")
    drafts, draft_logits = _drafts(get, vocab_size)
    params = _params(get, vocab_size)
    if params.beam_width > 1:
        samples = params.beam_width if samples is None else int(samples)
        _check_beam_search(params, samples, drafts)
    samples = int(samples or 1)
    _check("num_return_sequences", samples, 1 <= samples <= MAX_SAMPLES, f"in [1, {MAX_SAMPLES}]")
    return ParsedRequest(
        _prompt(get),
        params,
        bool(scalar(get, "streaming", False)),
        priority,
        timeout_s,
        samples,
        drafts,
        draft_logits,
        _prompt_table(get, hidden_size),
        _guide(get),
        bool(scalar(get, "include_stop_words_in_output", True)),
        bool(scalar(get, "skip_special_tokens", True)),
        _stream_interval(get),
    )


def _stream_interval(get: TensorLookup) -> int | None:
    interval = scalar(get, "stream_interval")
    if interval is not None:
        _check("stream_interval", interval, interval >= 1, ">= 1")
    return interval


def _guide(get: TensorLookup) -> tuple[str, str] | None:
    guide_type, guide = scalar(get, "guided_decoding_guide_type"), scalar(get, "guided_decoding_guide")
    if guide_type is None:
        if guide is not None:
            raise RequestError("guided_decoding_guide", "guided_decoding_guide needs a guided_decoding_guide_type")
        return None
    return _text(guide_type), "" if guide is None else _text(guide)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_beam_search(params: SamplingParams, samples: int, drafts: list[int]) -> None:
    width = params.beam_width
    if not params.greedy:
        raise RequestError(
            "beam_width", f"beam_width={width} decodes deterministically: temperature must be 0 or unset"
        )
    if not 1 <= samples <= width:
        raise RequestError(
            "num_return_sequences",
            f"num_return_sequences must be in [1, beam_width={width}] (the best beams), got {samples}",
        )
    if drafts:
        raise RequestError("draft_input_ids", f"draft_input_ids cannot be verified with beam_width={width}")
    if params.return_generation_logits or params.top_log_probs:
        raise RequestError(
            "return_generation_logits", f"return_generation_logits and num_top_log_probs need beam_width=1, got {width}"
        )


def _prompt_table(get: TensorLookup, hidden_size: int) -> torch.Tensor | None:
    table, size = get("prompt_embedding_table"), scalar(get, "prompt_vocab_size")
    if table is None:
        if size is not None:
            raise RequestError("prompt_vocab_size", "prompt_vocab_size needs a prompt_embedding_table")
        return None
    rows = table.reshape(-1, table.shape[-1]) if table.ndim >= 2 else None
    if rows is None or rows.shape[1] != hidden_size:
        raise RequestError(
            "prompt_embedding_table",
            f"prompt_embedding_table must be [1, rows, hidden_size={hidden_size}], got {list(table.shape)}",
        )
    size = rows.shape[0] if size is None else int(size)
    _check("prompt_vocab_size", size, 0 < size <= rows.shape[0], f"in [1, {rows.shape[0]}] (the table's rows)")
    return torch.from_numpy(rows[:size].astype(np.float32))


def _drafts(get: TensorLookup, vocab_size: int) -> tuple[list[int], torch.Tensor | None]:
    ids, logits = get("draft_input_ids"), get("draft_logits")
    drafts = [] if ids is None else ids.reshape(-1).astype(np.int64).tolist()
    bad = [t for t in drafts if not 0 <= t < vocab_size]
    if bad:
        raise RequestError("draft_input_ids", f"draft_input_ids holds token ids outside [0, {vocab_size}): {bad[:5]}")
    if logits is None:
        return drafts, None
    table = logits.reshape(-1, logits.shape[-1]) if logits.ndim >= 2 else logits
    if not drafts or table.shape != (len(drafts), vocab_size):
        raise RequestError(
            "draft_logits",
            f"draft_logits must be [num_draft_tokens={len(drafts)}, vocab_size={vocab_size}] "
            f"alongside draft_input_ids, got {list(logits.shape)}",
        )
    return drafts, torch.from_numpy(table.astype(np.float32))


def _prompt(get: TensorLookup) -> list[int]:
    ids = get("input_ids")
    if ids is None:
        raise RequestError("input_ids", "input_ids is required")
    if ids.ndim == 2 and ids.shape[0] != 1:
        raise RequestError(
            "input_ids", f"input_ids must be [1, num_input_tokens]; one sequence per request, got {list(ids.shape)}"
        )
    return ids.reshape(-1).astype(np.int64).tolist()


def _check(name: str, value, ok: bool, rule: str) -> None:
    if not ok:
        raise RequestError(name, f"{name} must be {rule}, got {value}")


def _either(get: TensorLookup, name: str, new_name: str) -> tuple[str, Any]:
    """An input that TensorRT-LLM renamed (random_seed -> seed, min_length -> min_tokens): either name, not both."""
    old, new = scalar(get, name), scalar(get, new_name)
    if old is not None and new is not None:
        raise RequestError(new_name, f"give {new_name} or {name}, not both")
    return (name, old) if new is None else (new_name, new)


def _params(get: TensorLookup, vocab_size: int) -> SamplingParams:
    max_tokens = scalar(get, "request_output_len")
    if max_tokens is None:
        raise RequestError("request_output_len", "request_output_len is required")
    _check("request_output_len", max_tokens, max_tokens >= 1, ">= 1")

    temperature = scalar(get, "temperature")
    top_k = scalar(get, "runtime_top_k")
    top_p = scalar(get, "runtime_top_p")
    if temperature is not None:
        _check("temperature", temperature, temperature >= 0, ">= 0")
    if top_k is not None:
        _check("runtime_top_k", top_k, top_k >= 0, ">= 0")
    if top_p is not None:
        _check("runtime_top_p", top_p, 0 < top_p <= 1, "in (0, 1]")
    seed_name, seed = _either(get, "random_seed", "seed")
    if seed is not None:
        _check(seed_name, seed, 0 <= seed <= UINT64_MAX, "a uint64")
    end_id = scalar(get, "end_id", NO_END_ID)
    _check("end_id", end_id, end_id == NO_END_ID or 0 <= end_id < vocab_size, f"-1 or a token id below {vocab_size}")
    pad_id = scalar(get, "pad_id")
    if pad_id is not None:
        _check("pad_id", pad_id, 0 <= pad_id < vocab_size, f"a token id below {vocab_size}")

    repetition_penalty = float(scalar(get, "repetition_penalty", 1.0))
    _check("repetition_penalty", repetition_penalty, repetition_penalty > 0, "> 0")
    presence_penalty = float(scalar(get, "presence_penalty", 0.0))
    frequency_penalty = float(scalar(get, "frequency_penalty", 0.0))
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        _check(name, value, np.isfinite(value), "finite")
    min_name, min_length = _either(get, "min_length", "min_tokens")
    min_length = int(min_length or 0)
    _check(min_name, min_length, min_length >= 0, ">= 0")
    ngram = int(scalar(get, "no_repeat_ngram_size", 0))
    _check("no_repeat_ngram_size", ngram, ngram >= 0, ">= 0")
    top_log_probs = int(scalar(get, "num_top_log_probs", 0))
    _check("num_top_log_probs", top_log_probs, 0 <= top_log_probs <= MAX_TOP_LOG_PROBS, f"in [0, {MAX_TOP_LOG_PROBS}]")

    beam_width = int(scalar(get, "beam_width", 1))
    _check("beam_width", beam_width, 1 <= beam_width <= MAX_BEAM_WIDTH, f"in [1, {MAX_BEAM_WIDTH}]")
    length_penalty = float(scalar(get, "len_penalty", 1.0))
    _check("len_penalty", length_penalty, np.isfinite(length_penalty), "finite")
    early_stopping = int(scalar(get, "early_stopping", 1))
    _check("early_stopping", early_stopping, early_stopping in EARLY_STOPPING, "1 (true), 0 (false) or -1 (never)")

    typical_p = float(scalar(get, "typical_p", 1.0))
    _check("typical_p", typical_p, 0 < typical_p <= 1, "in (0, 1]")

    sampled = temperature is not None or top_k is not None or top_p is not None or typical_p < 1.0
    return SamplingParams(
        max_tokens=int(max_tokens),
        # As in TensorRT-LLM, a request that sets none of the sampling tensors decodes greedily.
        temperature=float(1.0 if temperature is None else temperature) if sampled else 0.0,
        top_k=int(top_k or 0),
        top_p=float(1.0 if top_p is None else top_p),
        typical_p=typical_p,
        watermark=bool(scalar(get, "watermark", False)),
        seed=None if seed is None else int(seed),
        end_id=int(end_id),
        pad_id=int(pad_id if pad_id is not None else max(end_id, 0)),
        embedding_bias=_embedding_bias(get, vocab_size),
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        no_repeat_ngram_size=ngram,
        bad_words=_word_list(get, "bad_words_list", vocab_size),
        min_tokens=min_length,
        stop_words=_word_list(get, "stop_words_list", vocab_size),
        beam_width=beam_width,
        length_penalty=length_penalty,
        early_stopping=EARLY_STOPPING[early_stopping],
        return_log_probs=bool(scalar(get, "return_log_probs", False)),
        top_log_probs=top_log_probs,
        return_context_logits=bool(scalar(get, "return_context_logits", False)),
        return_generation_logits=bool(scalar(get, "return_generation_logits", False)),
        return_prompt_log_probs=bool(scalar(get, "return_prompt_log_probs", False)),
    )


def _embedding_bias(get: TensorLookup, vocab_size: int) -> torch.Tensor | None:
    bias = get("embedding_bias")
    if bias is None:
        return None
    flat = bias.reshape(-1)
    if flat.size == 0:
        return None  # tensorrtllm_backend sends an empty bias when none is wanted
    if flat.size != vocab_size:
        raise RequestError(
            "embedding_bias", f"embedding_bias must be [1, vocab_size={vocab_size}], got shape {list(bias.shape)}"
        )
    if not np.isfinite(flat).all():
        raise RequestError("embedding_bias", "embedding_bias must be finite")
    return torch.from_numpy(flat.astype(np.float32))


def _word_list(get: TensorLookup, name: str, vocab_size: int) -> list[list[int]]:
    array = get(name)
    return [] if array is None or array.size == 0 else decode_word_list(array, name, vocab_size)
