"""TensorRT-LLM's InferenceRequest tensors -> the engine's prompt and SamplingParams.

Kept free of Triton so it is tested directly; the `llm` model hands in a lookup of its input tensors.
Scalar parameters are declared, with their defaults and rules, in tritonllm/common/request_parameters.py; this module
adds the rules that tie several together, and the arrays. Every error names the tensor it is about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tritonllm.common.errors import RequestError
from tritonllm.common.request_parameters import EARLY_STOPPING, TensorLookup, read, scalar
from tritonllm.engine.state.sampling_params import NO_END_ID, SamplingParams
from tritonllm.engine.state.sequence import RopePositions
from tritonllm.engine.state.thinking_block import ThinkingBlock
from tritonllm.tokenizer.word_lists import decode_word_list


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
    prediction: list[int]  # Predicted Outputs: ids the answer is expected to repeat, drafted from
    exclude_input: bool = True  # false: a non-streaming response's output_ids start with the prompt (TensorRT-LLM)
    perf_metrics: bool = False  # TensorRT-LLM's return_perf_metrics: KV blocks, timings, drafts in the last response
    rope_positions: RopePositions | None = None  # M-RoPE's, for a Qwen2-VL prompt with media


def is_stop_request(get: TensorLookup) -> bool:
    return bool(scalar(get, "stop", False))


def pause_request(get: TensorLookup) -> bool | None:
    """A pause (True) or resume (False) of the engine; None for any other request."""
    value = scalar(get, "pause")
    return None if value is None else bool(value)


def parse(get: TensorLookup, vocab_size: int, triton_timeout_us: int = 0, hidden_size: int = 0) -> ParsedRequest:
    """`triton_timeout_us`: the request's own Triton timeout, used when no `timeout_ms` tensor is given.
    `hidden_size`: the model's, which a p-tuning table must match."""
    timeout_ms = read(get, "timeout_ms")
    timeout_s = timeout_ms / 1e3 if timeout_ms is not None else (triton_timeout_us / 1e6 if triton_timeout_us else None)
    samples = read(get, "num_return_sequences")
    drafts, draft_logits = _drafts(get, vocab_size)
    params = _params(get, vocab_size)
    if params.beam_width > 1:
        samples = params.beam_width if samples is None else samples
        _check_beam_search(params, samples, drafts, read(get, "temperature"))
    prompt = _prompt(get)
    return ParsedRequest(
        prompt,
        params,
        read(get, "streaming"),
        read(get, "priority"),
        timeout_s,
        samples or 1,
        drafts,
        draft_logits,
        _prompt_table(get, hidden_size),
        _guide(get),
        read(get, "include_stop_words_in_output"),
        read(get, "skip_special_tokens"),
        read(get, "stream_interval"),
        _token_ids(get, "prediction_ids", vocab_size),
        bool(scalar(get, "exclude_input_in_output", True)),
        bool(scalar(get, "return_perf_metrics", False)),
        _rope_positions(get, len(prompt)),
    )


def _token_ids(get: TensorLookup, name: str, vocab_size: int) -> list[int]:
    tensor = get(name)
    ids = [] if tensor is None else tensor.reshape(-1).astype(np.int64).tolist()
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(name, f"{name} holds token ids outside [0, {vocab_size}): {bad[:5]}")
    return ids


def _guide(get: TensorLookup) -> tuple[str, str] | None:
    guide_type, guide = read(get, "guided_decoding_guide_type"), read(get, "guided_decoding_guide")
    if guide_type is None:
        if guide is not None:
            raise RequestError("guided_decoding_guide", "guided_decoding_guide needs a guided_decoding_guide_type")
        return None
    return guide_type, guide or ""


def _check_beam_search(params: SamplingParams, samples: int, drafts: list[int], temperature: float | None) -> None:
    width = params.beam_width
    if not params.greedy:
        raise RequestError(
            "beam_width",
            f"beam_width={width} decodes deterministically: runtime_top_k, runtime_top_p, typical_p and min_p "
            "must be unset (or 0)",
        )
    if temperature not in (None, 0.0, 1.0):  # TensorRT-LLM's clients send 1.0; other values would scale its scores
        raise RequestError(
            "temperature", f"beam_width={width} scores beams without a temperature: it must be 0, 1 or unset"
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
    """p-tuning's table, or a multimodal prompt's media rows (preprocessing's, never beside a table)."""
    table, size = get("prompt_embedding_table"), read(get, "prompt_vocab_size")
    media = get("multimodal_embeddings")
    if media is not None and media.size:
        if table is not None:
            raise RequestError("prompt_embedding_table", "prompt_embedding_table cannot be sent with media")
        if media.shape[-1] != hidden_size:
            raise RequestError("multimodal_embeddings", f"multimodal_embeddings rows must hold {hidden_size} values")
        return torch.from_numpy(np.ascontiguousarray(media.reshape(-1, hidden_size), dtype=np.float32))
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
    size = rows.shape[0] if size is None else size
    _check("prompt_vocab_size", size, 0 < size <= rows.shape[0], f"in [1, {rows.shape[0]}] (the table's rows)")
    return torch.from_numpy(rows[:size].astype(np.float32))


def _rope_positions(get: TensorLookup, prompt_length: int) -> RopePositions | None:
    """M-RoPE's positions, [1, 3, prompt length], and the delta of the tokens after the prompt."""
    positions, delta = get("mrope_positions"), get("mrope_position_deltas")
    if positions is None or not positions.size:
        return None
    if positions.reshape(-1).size != 3 * prompt_length:
        raise RequestError(
            "mrope_positions", f"mrope_positions must be [1, 3, {prompt_length}] (three per prompt token)"
        )
    delta = 0 if delta is None else int(delta.reshape(-1)[0])
    return RopePositions(torch.from_numpy(positions.reshape(3, prompt_length).astype(np.int64)), delta)


def _drafts(get: TensorLookup, vocab_size: int) -> tuple[list[int], torch.Tensor | None]:
    drafts, logits = _token_ids(get, "draft_input_ids", vocab_size), get("draft_logits")
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
    ids = ids.reshape(-1).astype(np.int64).tolist()
    length = scalar(get, "input_lengths")
    if length is None:
        return ids
    # TensorRT-LLM's required companion of input_ids: the prompt's length, padding after it stripped
    _check("input_lengths", length, 1 <= length <= len(ids), f"in [1, {len(ids)}] (input_ids' length)")
    return ids[:length]


def _check(name: str, value, ok: bool, rule: str) -> None:
    if not ok:
        raise RequestError(name, f"{name} must be {rule}, got {value}")


def _either(get: TensorLookup, name: str, new_name: str) -> Any:
    """An input that TensorRT-LLM renamed (random_seed -> seed, min_length -> min_tokens): either name, not both."""
    given = [n for n in (name, new_name) if get(n) is not None]
    if len(given) == 2:
        raise RequestError(new_name, f"give {new_name} or {name}, not both")
    return read(get, given[0] if given else name)


def _params(get: TensorLookup, vocab_size: int) -> SamplingParams:
    max_tokens = scalar(get, "request_output_len")
    if max_tokens is None:
        raise RequestError("request_output_len", "request_output_len is required")
    _check("request_output_len", max_tokens, max_tokens >= 1, ">= 1")
    end_id = scalar(get, "end_id", NO_END_ID)
    _check("end_id", end_id, end_id == NO_END_ID or 0 <= end_id < vocab_size, f"-1 or a token id below {vocab_size}")
    pad_id = scalar(get, "pad_id")
    if pad_id is not None:
        _check("pad_id", pad_id, 0 <= pad_id < vocab_size, f"a token id below {vocab_size}")

    temperature, top_k, top_p = read(get, "temperature"), read(get, "runtime_top_k"), read(get, "runtime_top_p")
    typical_p, min_p = read(get, "typical_p"), read(get, "min_p")
    if top_p is not None and top_p <= 0:
        top_p = None  # TensorRT-LLM reads top_p <= 0 as unset (0.0 is its clients' default)
    # TensorRT-LLM's rule: greedy unless top-k or top-p asks to sample, whatever the temperature (its clients
    # send temperature 1.0 with top_k 1 or 0 for greedy output); typical_p and min_p are samplers too.
    sampled = (top_k or 0) > 1 or top_p is not None or typical_p < 1.0 or min_p > 0
    return SamplingParams(
        max_tokens=int(max_tokens),
        temperature=(1.0 if temperature is None else temperature) if sampled else 0.0,
        top_k=top_k or 0,
        top_p=1.0 if top_p is None else top_p,
        typical_p=typical_p,
        min_p=min_p,
        watermark=read(get, "watermark"),
        seed=_either(get, "random_seed", "seed"),
        end_id=int(end_id),
        pad_id=int(pad_id if pad_id is not None else max(end_id, 0)),
        embedding_bias=_embedding_bias(get, vocab_size),
        repetition_penalty=read(get, "repetition_penalty"),
        presence_penalty=read(get, "presence_penalty"),
        frequency_penalty=read(get, "frequency_penalty"),
        no_repeat_ngram_size=read(get, "no_repeat_ngram_size"),
        bad_words=_word_list(get, "bad_words_list", vocab_size),
        min_tokens=_either(get, "min_length", "min_tokens"),
        stop_words=_word_list(get, "stop_words_list", vocab_size),
        thinking=_thinking_block(get, vocab_size),
        beam_width=read(get, "beam_width"),
        length_penalty=read(get, "len_penalty"),
        early_stopping=EARLY_STOPPING[read(get, "early_stopping")],
        return_log_probs=read(get, "return_log_probs"),
        top_log_probs=read(get, "num_top_log_probs"),
        return_context_logits=read(get, "return_context_logits"),
        return_generation_logits=read(get, "return_generation_logits"),
        return_prompt_log_probs=read(get, "return_prompt_log_probs"),
        return_prompt_ids=read(get, "return_prompt_ids"),
    )


def _thinking_block(get: TensorLookup, vocab_size: int) -> ThinkingBlock | None:
    """The thinking block followed when its tags are given (a grammar then waits for its end), with the
    request's budget if any."""
    tokens = read(get, "thinking_budget")
    end_ids = _token_ids(get, "thinking_end_ids", vocab_size)
    if not end_ids:
        if tokens is not None:
            raise RequestError("thinking_end_ids", "thinking_budget needs thinking_end_ids: the closing tag's ids")
        return None
    return ThinkingBlock(tokens, tuple(_token_ids(get, "thinking_start_ids", vocab_size)), tuple(end_ids))


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
