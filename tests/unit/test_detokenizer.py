"""Joined stream pieces equal the whole text byte for byte, with CJK, emoji, byte pieces and spaces."""

from __future__ import annotations

import random

import pytest

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.tokenizer.detokenizer import CONTEXT_TOKENS, text_increment


def streamed_and_whole(tokenizer, prompt: list[int], output: list[int]) -> tuple[str, str]:
    tokens = prompt + output
    pieces = [
        text_increment(tokenizer, tokens[max(0, i - CONTEXT_TOKENS) : i], [tokens[i]], final=i == len(tokens) - 1)
        for i in range(len(prompt), len(tokens))
    ]
    whole = text_increment(tokenizer, prompt[-CONTEXT_TOKENS:], output, final=True)
    return "".join(pieces), whole


@pytest.mark.parametrize("seed", range(5))
def test_random_token_streams_join_to_the_whole_text(tokenizer, seed):
    rng = random.Random(seed)
    for _ in range(60):
        prompt = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 6))]
        output = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 40))]
        streamed, whole = streamed_and_whole(tokenizer, prompt, output)
        assert streamed == whole


def test_sampled_generations_with_multibyte_text_join_exactly(tiny_model_dir, tokenizer):
    engine = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=128, block_size=8))
    texts = [" Hello 你好", "😀 emoji 🎉 café", "数据 and more", "  leading spaces"]
    seqs = [
        Sequence(tokenizer.encode(t), SamplingParams(max_tokens=48, temperature=1.2, seed=i))
        for i, t in enumerate(texts)
    ]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    byte_pieces = 0
    for seq in seqs:
        streamed, whole = streamed_and_whole(tokenizer, seq.prompt_ids, seq.output_ids)
        assert streamed == whole
        assert whole.encode() == streamed.encode()
        byte_pieces += sum("\ufffd" in tokenizer.decode([t]) for t in seq.output_ids)
    assert byte_pieces > 0, "the generations should exercise tokens that are partial characters"


def test_leading_space_of_the_first_token_is_kept(tokenizer):
    prompt = tokenizer.encode("Hello")
    output = tokenizer.encode(" world")
    assert text_increment(tokenizer, prompt, output, final=True) == " world"


def test_bytes_no_later_byte_can_mend_go_out_at_once(tokenizer):
    """A model writing lone continuation bytes still streams: only the last replacement character waits."""
    byte = tokenizer.convert_tokens_to_ids("\u0122")  # byte-level BPE's name for the byte 0x80
    assert tokenizer.decode([byte] * 3) == "\ufffd" * 3
    prompt = tokenizer.encode("Hi")
    output = [byte] * 12
    tokens = prompt + output
    pieces = [
        text_increment(tokenizer, tokens[max(0, i - CONTEXT_TOKENS) : i], [tokens[i]], final=i == len(tokens) - 1)
        for i in range(len(prompt), len(tokens))
    ]
    assert all(pieces[1:]), pieces  # from the second byte on, every piece brings text
    assert "".join(pieces) == text_increment(tokenizer, prompt, output, final=True)
