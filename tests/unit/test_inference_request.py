"""InferenceRequest tensors -> engine parameters; bad values name their tensor."""

from __future__ import annotations

import numpy as np
import pytest

from tritonllm.engine.state.inference_request import parse
from tritonllm.tokenizer.word_lists import decode_word_list, encode_word_list

VOCAB = 4096


def request(**tensors):
    base = {"input_ids": np.array([[1, 2, 3]], dtype=np.int32), "request_output_len": np.array([[8]], dtype=np.int32)}
    base.update({k: (v if isinstance(v, np.ndarray) else np.array([[v]])) for k, v in tensors.items()})
    return lambda name: base.get(name)


def test_defaults_decode_greedily_without_an_end_id():
    parsed = parse(request(), VOCAB)
    assert parsed.prompt_ids == [1, 2, 3] and not parsed.streaming
    assert parsed.params.greedy and parsed.params.end_id == -1 and parsed.params.max_tokens == 8
    assert parsed.stream_interval is None  # the model's parameter decides


def test_stream_interval_arrives():
    assert parse(request(streaming=True, stream_interval=np.array([[4]], dtype=np.int32)), VOCAB).stream_interval == 4


def test_any_sampling_tensor_turns_sampling_on():
    assert not parse(request(runtime_top_p=np.array([[0.9]], dtype=np.float32)), VOCAB).params.greedy
    assert parse(request(temperature=np.array([[0.0]], dtype=np.float32)), VOCAB).params.greedy


def fp32(value: float) -> np.ndarray:
    return np.array([[value]], dtype=np.float32)


def int32(value: int) -> np.ndarray:
    return np.array([[value]], dtype=np.int32)


@pytest.mark.parametrize(
    "tensors",
    [
        {"temperature": fp32(1.0)},  # TensorRT-LLM's clients send temperature 1.0 with nothing else asking to sample
        {"temperature": fp32(1.0), "runtime_top_k": int32(1), "runtime_top_p": fp32(0.0)},  # their defaults
        {"temperature": fp32(0.7), "runtime_top_k": int32(0), "runtime_top_p": fp32(-1.0)},  # top_p <= 0: unset
    ],
)
def test_tensorrt_llms_rule_decodes_greedily_unless_top_k_or_top_p_asks_to_sample(tensors):
    params = parse(request(**tensors), VOCAB).params
    assert params.greedy and params.top_p == 1.0


def test_top_k_above_one_or_a_top_p_samples_at_the_temperature():
    assert parse(request(temperature=fp32(0.7), runtime_top_k=int32(40)), VOCAB).params.temperature == pytest.approx(
        0.7
    )
    sampled = parse(request(temperature=fp32(0.7), runtime_top_p=fp32(1.0)), VOCAB).params
    assert not sampled.greedy and sampled.top_p == 1.0


def test_beam_search_takes_the_temperature_tensorrt_llms_clients_send():
    assert parse(request(beam_width=int32(2), temperature=fp32(1.0)), VOCAB).num_samples == 2
    with pytest.raises(ValueError, match="temperature"):  # it would scale TensorRT-LLM's scores, not ours
        parse(request(beam_width=int32(2), temperature=fp32(0.7)), VOCAB)


def test_input_lengths_strips_the_padding_after_the_prompt():
    assert parse(
        request(input_ids=np.array([[4, 5, 6, 0, 0]], dtype=np.int32), input_lengths=int32(3)), VOCAB
    ).prompt_ids == [4, 5, 6]
    assert parse(request(input_lengths=int32(3)), VOCAB).prompt_ids == [1, 2, 3]
    with pytest.raises(ValueError, match="input_lengths"):
        parse(request(input_lengths=int32(4)), VOCAB)


def test_exclude_input_in_output_and_perf_metrics_arrive():
    assert parse(request(), VOCAB).exclude_input and not parse(request(), VOCAB).perf_metrics
    parsed = parse(request(exclude_input_in_output=False, return_perf_metrics=True), VOCAB)
    assert not parsed.exclude_input and parsed.perf_metrics


def test_all_processing_tensors_arrive():
    words = encode_word_list([[5, 6], [7]])
    p = parse(
        request(
            repetition_penalty=1.2,
            presence_penalty=0.5,
            frequency_penalty=0.25,
            min_length=3,
            no_repeat_ngram_size=2,
            embedding_bias=np.zeros((1, VOCAB), dtype=np.float32),
            bad_words_list=words[None],
            stop_words_list=words[None],
            return_log_probs=True,
            num_top_log_probs=5,
            return_context_logits=True,
            return_generation_logits=True,
            random_seed=np.array([[(1 << 64) - 1]], dtype=np.uint64),
        ),
        VOCAB,
    ).params
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (pytest.approx(1.2), 0.5, 0.25)
    assert (p.min_tokens, p.no_repeat_ngram_size, p.top_log_probs) == (3, 2, 5)
    assert p.bad_words == p.stop_words == [[5, 6], [7]]
    assert p.return_log_probs and p.return_context_logits and p.return_generation_logits
    assert p.embedding_bias.shape == (VOCAB,) and p.seed == (1 << 64) - 1


@pytest.mark.parametrize(
    ("tensors", "name"),
    [
        ({"input_ids": None}, "input_ids"),
        ({"input_ids": np.array([[1, 2], [3, 4]])}, "input_ids"),
        ({"request_output_len": None}, "request_output_len"),
        ({"request_output_len": 0}, "request_output_len"),
        ({"temperature": -0.5}, "temperature"),
        ({"runtime_top_k": -1}, "runtime_top_k"),
        ({"runtime_top_p": 1.5}, "runtime_top_p"),
        ({"end_id": VOCAB}, "end_id"),
        ({"pad_id": -3}, "pad_id"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": np.array([[np.inf]], dtype=np.float32)}, "presence_penalty"),
        ({"min_length": -1}, "min_length"),
        ({"no_repeat_ngram_size": -2}, "no_repeat_ngram_size"),
        ({"num_top_log_probs": 21}, "num_top_log_probs"),
        ({"embedding_bias": np.zeros((1, 10), dtype=np.float32)}, "embedding_bias"),
        ({"bad_words_list": np.array([[1, 2, 3]])}, "bad_words_list"),
        ({"bad_words_list": np.array([[1, 2], [3, 1]])}, "bad_words_list"),
        ({"stop_words_list": np.array([[1, 2], [5, -1]])}, "stop_words_list"),
        ({"stop_words_list": np.array([[1, VOCAB], [2, -1]])}, "stop_words_list"),
        ({"stop_words_list": np.array([[1, 2, 3], [1, -1, 3]])}, "stop_words_list"),
        ({"streaming": np.array([[True, False]])}, "streaming"),
        ({"stream_interval": 0}, "stream_interval"),
        ({"beam_width": 0}, "beam_width"),
        ({"beam_width": 17}, "beam_width"),
        ({"beam_width": 2, "runtime_top_p": 0.9}, "beam_width"),
        ({"beam_width": 2, "num_return_sequences": 3}, "num_return_sequences"),
        ({"beam_width": 2, "draft_input_ids": np.array([[5]])}, "draft_input_ids"),
        ({"beam_width": 2, "return_generation_logits": True}, "return_generation_logits"),
        ({"len_penalty": np.array([[np.nan]], dtype=np.float32)}, "len_penalty"),
        ({"early_stopping": 2}, "early_stopping"),
    ],
)
def test_bad_values_name_their_tensor(tensors, name):
    get = request(**{k: v for k, v in tensors.items() if v is not None})
    missing = [k for k, v in tensors.items() if v is None]
    with pytest.raises(ValueError, match=name):
        parse(lambda n: None if n in missing else get(n), VOCAB)


def test_word_lists_round_trip():
    words = [[1, 2], [3], [4, 5, 6]]
    encoded = encode_word_list(words)
    assert encoded.tolist() == [[1, 2, 3, 4, 5, 6], [2, 3, 6, -1, -1, -1]]
    assert decode_word_list(encoded, "x", VOCAB) == words
    assert decode_word_list(encode_word_list([]), "x", VOCAB) == []


def test_draft_tensors_arrive_and_are_checked():
    logits = np.zeros((1, 2, VOCAB), dtype=np.float32)
    parsed = parse(request(draft_input_ids=np.array([[5, 6]], dtype=np.int32), draft_logits=logits), VOCAB)
    assert parsed.draft_tokens == [5, 6] and parsed.draft_logits.shape == (2, VOCAB)
    with pytest.raises(ValueError, match="draft_input_ids"):
        parse(request(draft_input_ids=np.array([[VOCAB]], dtype=np.int32)), VOCAB)
    with pytest.raises(ValueError, match="draft_logits"):
        parse(request(draft_input_ids=np.array([[5]], dtype=np.int32), draft_logits=logits), VOCAB)


def test_prompt_table_tensors_are_checked():
    table = np.zeros((1, 3, 128), dtype=np.float16)
    parsed = parse(request(prompt_embedding_table=table, prompt_vocab_size=2), VOCAB, hidden_size=128)
    assert parsed.prompt_table.shape == (2, 128) and parsed.prompt_table.dtype.is_floating_point
    with pytest.raises(ValueError, match="prompt_embedding_table"):
        parse(request(prompt_embedding_table=table), VOCAB, hidden_size=64)
    with pytest.raises(ValueError, match="prompt_vocab_size"):
        parse(request(prompt_embedding_table=table, prompt_vocab_size=4), VOCAB, hidden_size=128)
    with pytest.raises(ValueError, match="prompt_vocab_size"):
        parse(request(prompt_vocab_size=4), VOCAB, hidden_size=128)


def test_beam_search_tensors_arrive():
    parsed = parse(request(beam_width=4, len_penalty=0.5, early_stopping=-1, end_id=7), VOCAB)
    p = parsed.params
    assert (p.beam_width, p.length_penalty, p.early_stopping, p.pad_id) == (4, 0.5, "never", 7)
    assert parsed.num_samples == 4  # every beam comes back unless num_return_sequences asks for fewer
    assert parse(request(beam_width=4, num_return_sequences=2), VOCAB).num_samples == 2
    assert parse(request(beam_width=4), VOCAB).params.early_stopping is True
