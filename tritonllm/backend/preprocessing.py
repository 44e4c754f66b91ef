"""The preprocessing model's work: a prompt as text, chat messages or token ids -> the llm's request tensors
(tokenized, checked against the context, with its word lists, biases and thinking tags), a row each for a batch
of prompts, under our names and tensorrtllm_backend's."""

from __future__ import annotations

import os

import numpy as np
from jinja2 import TemplateError

from tritonllm.backend import tensorrt_llm_face
from tritonllm.backend.media_prompt import Encode, MediaPrompts, MediaRows, media_policy
from tritonllm.backend.model_parameters import TOOL_CALL_PARSER_ENV, ModelParameters, json_list, json_object, strings
from tritonllm.common.errors import RequestError
from tritonllm.common.memory import release_free_memory
from tritonllm.formats.multimodal_folder import read_config, text_config
from tritonllm.tokenizer.backend_tokenizer import cached_snapshot, load_backend_tokenizer
from tritonllm.tokenizer.info import tokenizer_info
from tritonllm.tokenizer.reasoning import CLOSING, OPENING, leaves_block_open
from tritonllm.tokenizer.tool_calls import renders_tools, resolve_format, with_tools_in_prompt
from tritonllm.tokenizer.word_lists import encode_word_list

# apply_chat_template's own arguments, which chat_template_kwargs cannot set
RENDER_ARGUMENTS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "sanitize_control_tokens",
    }
)


THEIR_NAME = {ours: theirs for theirs, ours in tensorrt_llm_face.PREPROCESSING_INPUTS.items()}


def _tensor(row: dict[str, np.ndarray], name: str) -> np.ndarray | None:
    """One prompt's input by our name, or by the name tensorrtllm_backend's preprocessing gives it (QUERY, ...)."""
    array = row.get(name)
    if array is None and name in THEIR_NAME:
        return row.get(THEIR_NAME[name])
    return array


def _string(row, name: str) -> str | None:
    tensor = _tensor(row, name)
    if tensor is None:
        return None
    value = tensor.reshape(-1)
    if value.size != 1:
        raise RequestError(name, f"{name} must hold one string, got {value.size}")
    return strings(value)[0]


def _int(row, name: str, default: int) -> int:
    tensor = _tensor(row, name)
    return default if tensor is None else int(tensor.reshape(-1)[0])


def _bool(row, name: str, default: bool | None) -> bool | None:
    tensor = _tensor(row, name)
    return default if tensor is None else bool(tensor.reshape(-1)[0])


def _ids(row, name: str) -> list[int]:
    tensor = _tensor(row, name)
    return [] if tensor is None else tensor.reshape(-1).astype(np.int64).tolist()


def _floats(row, name: str) -> list[float]:
    tensor = _tensor(row, name)
    return [] if tensor is None else tensor.reshape(-1).tolist()


def _strings_array(texts: list[str]) -> np.ndarray:
    return np.array([[t.encode("utf-8") for t in texts]], dtype=np.object_)


def _same_length(name: str, values: list, other_name: str, others: list) -> None:
    if len(values) != len(others):
        raise RequestError(name, f"{name} has {len(values)} entries but {other_name} has {len(others)}")


# Outputs a caller asks for alone, answered from the tokenizer without reading any input: the shim's
# /tokenize context (tokenizer_info) and its own detokenizer (tokenizer_snapshot).
TOKENIZER_OUTPUTS = frozenset({"tokenizer_info", "tokenizer_snapshot"})


NO_ROWS = np.zeros((1, 0, 0), dtype=np.float32)
NO_ROPE_POSITIONS = np.zeros((1, 3, 0), dtype=np.int32)


class Preprocessor:
    def __init__(self, params: ModelParameters, encode: Encode | None = None) -> None:
        """`encode`: the multimodal_encoders model, called for a prompt with media (a multimodal model only)."""
        self.model_dir = params.model_dir()
        self.tokenizer = load_backend_tokenizer(self.model_dir)  # transformers' only on a first start
        policy = media_policy(
            params.get("allowed_local_media_path", ""),
            params.get("allowed_media_domains", ""),
            params.get("max_image_pixels", ""),
        )
        self.media = MediaPrompts.of(self.model_dir, policy, encode)
        self.default_max_tokens = params.int("default_max_tokens", 16)
        self.add_special_tokens = params.bool("add_special_tokens", True)
        parser = os.environ.get(TOOL_CALL_PARSER_ENV) or params.get("tool_call_parser", "auto")
        self.tool_format = resolve_format(parser, self.tokenizer)
        # a reasoning model's think tags as ids, for the llm's thinking_budget (and grammars after the thinking)
        self.thinking_tags = tuple(self.tokenizer.encode(tag, add_special_tokens=False) for tag in (OPENING, CLOSING))
        # A template that renders no tools (SmolLM2's) gets them in the system prompt, in tool_format's words.
        self.template_renders_tools = renders_tools(self.tokenizer)
        # Prompt tokens allowed: min(max_input_tokens, max_seq_len - 1, the model's max_position_embeddings).
        positions = text_config(read_config(self.model_dir)).get("max_position_embeddings", 1 << 31)
        self.limits = {
            "max_input_tokens": params.int("max_input_tokens", 1 << 31),
            "max_seq_len - 1": params.int("max_seq_len", 1 << 31) - 1,
            "max_position_embeddings - 1": positions - 1,
        }
        self.max_prompt_tokens = min(self.limits.values())
        self.context = min(params.int("max_seq_len", 1 << 31), positions)  # prompt and generated tokens
        self.exclude_input = params.exclude_input_in_output()
        release_free_memory()  # the tokenizer's and the template's load

    def tokenizer_output(self, name: str) -> np.ndarray:
        """One of TOKENIZER_OUTPUTS, as a [1, 1] BYTES tensor."""
        if name == "tokenizer_info":
            return _strings_array([tokenizer_info(self.tokenizer, self.context, str(self.model_dir))])
        return _strings_array([cached_snapshot(self.model_dir) or ""])

    def outputs(self, inputs: dict[str, np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
        """A request's tensors: several prompts in one request, as TensorRT-LLM's clients batch them, are a row
        each, stacked again; tensorrtllm_backend's output names beside ours, for its clients."""
        rows = [self._prompt(row, wanted) for row in tensorrt_llm_face.split_rows(inputs)]
        ours = rows[0] if len(rows) == 1 else tensorrt_llm_face.stacked(rows)
        return {**ours, **tensorrt_llm_face.preprocessing_outputs(ours, wanted)}

    def _prompt(self, row: dict[str, np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
        """One prompt's inputs -> the llm's tensors for it, each [1, ...]."""
        max_tokens = _int(row, "max_tokens", self.default_max_tokens)
        if max_tokens < 1:
            raise RequestError("max_tokens", f"max_tokens must be >= 1, got {max_tokens}")
        ids, media_rows = self._tokenize(row, max_tokens if _bool(row, "max_tokens_must_fit", False) else None)
        rope = None if media_rows is None else media_rows.rope_positions
        bad_words = self._word_list(row, "bad_words")
        stop_token_ids = [t for t in _ids(row, "stop_token_ids") if 0 <= t < len(self.tokenizer)]
        stop_words = self._word_list(row, "stop_words", [[t] for t in stop_token_ids])
        bias = self._embedding_bias(row)
        prediction = _string(row, "prediction")
        prediction_ids = self.tokenizer.encode(prediction, add_special_tokens=False) if prediction else []
        thinking_start_ids, thinking_end_ids = self._thinking_tags(row, ids)
        tok = self.tokenizer
        end_id = _int(row, "end_id", tok.eos_token_id if tok.eos_token_id is not None else -1)
        pad_id = _int(row, "pad_id", tok.pad_token_id if tok.pad_token_id is not None else end_id)
        if _bool(row, "ignore_eos", False):
            end_id = -1
        # asked for by callers that only tokenize (the shim's /tokenize), never by the ensemble
        extra = {}
        if "token_strs" in wanted:
            extra["token_strs"] = _strings_array(tok.convert_ids_to_tokens(ids))
        if "context_len" in wanted:
            extra["context_len"] = np.array([[self.context]], dtype=np.int32)
        return {
            **extra,
            "input_ids": np.array([ids], dtype=np.int32),
            "input_lengths": np.array([[len(ids)]], dtype=np.int32),
            "request_output_len": np.array([[max_tokens]], dtype=np.int32),
            "end_id": np.array([[end_id]], dtype=np.int32),
            "pad_id": np.array([[pad_id]], dtype=np.int32),
            "bad_words_list": bad_words[None],
            "stop_words_list": stop_words[None],
            "embedding_bias": bias[None],
            "prediction_ids": np.array([prediction_ids], dtype=np.int32),
            "thinking_start_ids": np.array([thinking_start_ids], dtype=np.int32),
            "thinking_end_ids": np.array([thinking_end_ids], dtype=np.int32),
            # the request's, else the model's parameter (TensorRT-LLM's: false echoes the prompt)
            "exclude_input_in_output": np.array([[_bool(row, "exclude_input_in_output", self.exclude_input)]]),
            # the rows that the prompt's media tokens (ids from the vocabulary size on) name; none: [1, 0, 0]
            "multimodal_embeddings": NO_ROWS if media_rows is None else media_rows.rows[None],
            # an M-RoPE model's: each prompt token's three rotary positions, and the offset of those after it
            "mrope_positions": NO_ROPE_POSITIONS if rope is None else rope[None].astype(np.int32),
            "mrope_position_deltas": np.array([[0 if media_rows is None else media_rows.rope_delta]], dtype=np.int32),
        }

    def _thinking_tags(self, row, ids: list[int]) -> tuple[list[int], list[int]]:
        """With a thinking_budget or thinking_open, the ids of the tags the llm follows the thinking block by: the
        opening one (none when the answer starts inside the block) and the closing one."""
        inside = _bool(row, "thinking_open", None)
        if inside is None:
            if _tensor(row, "thinking_budget") is None:
                return [], []
            inside = leaves_block_open(self.tokenizer.decode(ids))
        opening, closing = self.thinking_tags
        return ([] if inside else opening), closing

    def _words(self, row, name: str) -> list[str]:
        tensor = _tensor(row, name)
        if tensor is None:
            return []
        return strings(tensor)

    def _word_list(self, row, name: str, extra: list[list[int]] | None = None) -> np.ndarray:
        """Words as text -> the llm's [2, N] list; each word tokenized on its own, as tensorrtllm_backend does."""
        words = [self.tokenizer.encode(w, add_special_tokens=False) for w in self._words(row, name) if w]
        return encode_word_list(words + (extra or []))

    def _embedding_bias(self, row) -> np.ndarray:
        """embedding_bias_words + embedding_bias_weights (on each word's tokens) and logit_bias_ids +
        logit_bias_values (on those token ids) -> one [vocab] bias (empty: none)."""
        words = self._words(row, "embedding_bias_words")
        weights = _floats(row, "embedding_bias_weights")
        _same_length("embedding_bias_words", words, "embedding_bias_weights", weights)
        ids, values = _ids(row, "logit_bias_ids"), _floats(row, "logit_bias_values")
        _same_length("logit_bias_ids", ids, "logit_bias_values", values)
        if not words and not ids:
            return np.zeros(0, dtype=np.float32)
        self._check_ids("logit_bias_ids", ids)
        bias = np.zeros(len(self.tokenizer), dtype=np.float32)
        for word, weight in zip(words, weights, strict=True):
            for token in self.tokenizer.encode(word, add_special_tokens=False):
                bias[token] += weight
        np.add.at(bias, ids, values)
        return bias

    def _check_ids(self, name: str, ids: list[int]) -> None:
        vocab = len(self.tokenizer)
        outside = [t for t in ids if not 0 <= t < vocab]
        if outside:
            raise RequestError(name, f"{name} holds token ids outside [0, {vocab}): {outside[:5]}")

    def _render(self, row, conversation: list, tools: list | None, renderer=None) -> list[int] | str:
        """A chat's ids, rendered as the request asks: continued, with its template variables, its own template.
        `renderer`: a multimodal model's processor, which renders the text its media placeholders are put in."""
        continued = _bool(row, "continue_final_message", False)
        generation_prompt = _bool(row, "add_generation_prompt", not continued)
        if continued and generation_prompt:
            raise RequestError("continue_final_message", "continue_final_message needs add_generation_prompt: false")
        raw = _string(row, "chat_template_kwargs")
        variables = json_object(raw, "chat_template_kwargs") if raw else {}
        reserved = sorted(RENDER_ARGUMENTS & set(variables))
        if reserved:
            field = f"chat_template_kwargs.{reserved[0]}"
            raise RequestError(field, f"{field} is not a template variable")
        arguments = dict(
            tools=tools,
            add_generation_prompt=generation_prompt,
            continue_final_message=continued,
            chat_template=_string(row, "chat_template") or None,
            **variables,
        )
        special = _bool(row, "add_special_tokens", False)  # vLLM's: the tokenizer's own on top of the template's
        try:
            if renderer is not None:
                return renderer.apply_chat_template(conversation, tokenize=False, **arguments)
            if special:
                text = self.tokenizer.apply_chat_template(conversation, tokenize=False, **arguments)
                return self.tokenizer.encode(text, add_special_tokens=True)
            encoded = self.tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True, **arguments)
        except (TemplateError, ValueError, TypeError) as e:  # the request's template, variables or last message
            raise RequestError("chat_messages", f"the chat template could not render chat_messages: {e}") from e
        return list(encoded["input_ids"])

    def _chat(self, row, conversation: list, tools: list | None) -> tuple[list[int], MediaRows | None]:
        """A chat's ids, and the embedding rows of its media when it has any."""
        media = []
        if self.media is not None:
            conversation, media = self.media.split(conversation)
        if not media:
            return self._render(row, conversation, tools), None
        if _bool(row, "truncate_prompt", False):
            raise RequestError("truncate_prompt", "truncate_prompt would cut a prompt with media; send it without")
        return self.media.ids_and_rows(conversation, media, lambda processor, c: self._render(row, c, tools, processor))

    def _cut(self, row, ids: list[int], output_tokens: int) -> list[int]:
        """vLLM's truncate_prompt_tokens: the prompt's last (truncation_side "left", the default) or first ("right")
        so many tokens; -1 as many as fit before `output_tokens`. More than fit is an error, as in vLLM."""
        keep, side = _int(row, "truncate_prompt_tokens", -1), _string(row, "truncation_side") or "left"
        room = min(self.max_prompt_tokens, self.context - output_tokens)
        if side not in ("left", "right"):
            raise RequestError("truncation_side", f"truncation_side must be left or right, got {side!r}")
        if keep == -1:
            keep = room
        if not 0 < keep <= room:
            raise RequestError(
                "truncate_prompt_tokens",
                f"truncate_prompt_tokens must be -1 or in [1, {room}] (the prompt tokens that fit before "
                f"{output_tokens} output tokens), got {keep}",
            )
        return ids[-keep:] if side == "left" else ids[:keep]

    def _tensor_images(self, row) -> list:
        """TensorRT-LLM's image inputs beside a text_input: image_url_input, image_bytes_input."""
        urls, pixels = self._words(row, "image_url_input"), _tensor(row, "image_bytes_input")
        if pixels is not None:
            pixels = pixels.reshape(-1, *pixels.shape[-3:]) if pixels.size else None
        if not urls and pixels is None:
            return []
        if self.media is None or "image" not in self.media.kinds:
            field = "image_url_input" if urls else "image_bytes_input"
            raise RequestError(field, f"{field}: this model takes text only")
        return self.media.images_of(urls, pixels)

    def _tokenize(self, row, output_tokens: int | None) -> tuple[list[int], MediaRows | None]:
        """The prompt's ids (and its media's embedding rows); `output_tokens` (max_tokens_must_fit): they must fit
        in the context after it."""
        media_rows = None
        messages = _string(row, "chat_messages")
        if messages is not None:
            conversation = json_list(messages, "chat_messages")
            tools = _string(row, "chat_tools")
            tools = json_list(tools, "chat_tools") if tools else None
            if tools and not self.template_renders_tools:
                conversation, tools = with_tools_in_prompt(conversation, tools, self.tool_format), None
            ids, media_rows = self._chat(row, conversation, tools)
        elif _tensor(row, "prompt_token_ids") is not None:
            ids = _ids(row, "prompt_token_ids")
            self._check_ids("prompt_token_ids", ids)
        else:
            text = _string(row, "text_input")
            if text is None:
                raise RequestError("text_input", "text_input (or chat_messages, or prompt_token_ids) is required")
            raw = _bool(row, "use_raw_prompt", False)  # exactly the text: no special tokens added
            images = self._tensor_images(row)
            if images:  # the text holds the model's image placeholders, as TensorRT-LLM's clients write them
                ids, media_rows = self.media.ids_and_rows([], images, lambda processor, _: text)
            else:
                ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens and not raw)
        if _tensor(row, "truncate_prompt_tokens") is not None:
            if media_rows is not None:
                raise RequestError("truncate_prompt_tokens", "truncate_prompt_tokens would cut a prompt with media")
            ids = self._cut(row, ids, output_tokens or 0)
        if not ids:
            raise RequestError("text_input", "text_input is empty after tokenization")
        if len(ids) > self.max_prompt_tokens:
            if not _bool(row, "truncate_prompt", False):
                limits = ", ".join(f"{name} = {value}" for name, value in self.limits.items() if value < 1 << 30)
                raise RequestError(
                    "text_input",
                    f"text_input has {len(ids)} tokens; at most {self.max_prompt_tokens} are allowed ({limits})",
                )
            ids = ids[len(ids) - self.max_prompt_tokens :]  # keep the end, which the generation continues
        if output_tokens is not None and len(ids) + output_tokens > self.context:
            if not _bool(row, "truncate_prompt", False) or output_tokens >= self.context:
                raise RequestError(
                    "max_tokens",
                    f"max_tokens is too large: {output_tokens}; the context holds {self.context} tokens and the "
                    f"prompt has {len(ids)} ({output_tokens} > {self.context} - {len(ids)})",
                )
            ids = ids[len(ids) + output_tokens - self.context :]
        return ids, media_rows
