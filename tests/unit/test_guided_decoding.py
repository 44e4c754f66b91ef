"""Grammar-constrained decoding: whatever the (random) weights, the output follows the grammar."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tritonllm.engine.decoding.grammar import GrammarCompiler
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import FinishReason, Sequence

from .test_engine import make_engine, random_prompts, run

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}},
                "required": ["x"],
                "additionalProperties": False,
            },
            "label": {"type": ["string", "null"], "maxLength": 6},
        },
        "required": ["point", "label"],
        "additionalProperties": False,
    },
]


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer)


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_schema_output_validates_greedy_and_sampled(tiny_model_dir, tokenizer, compiler, schema):
    engine = make_engine(tiny_model_dir)
    prompts = random_prompts(4, seed=21, max_len=20)
    seqs = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(
            max_tokens=200, temperature=0.0 if i % 2 else 1.0, seed=i, end_id=tokenizer.eos_token_id
        )
        seq = Sequence(prompt, params)
        seq.grammar = compiler.matcher("json_schema", json.dumps(schema))
        seqs.append(seq)
    seqs.append(Sequence(prompts[0], SamplingParams(max_tokens=8)))  # unconstrained, in the same batch
    run(engine, seqs)
    for seq in seqs[:-1]:
        assert seq.finish_reason is FinishReason.END_ID
        jsonschema.validate(json.loads(tokenizer.decode(seq.output_ids, skip_special_tokens=True)), schema)
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_regex_and_lark_guides(tiny_model_dir, tokenizer, compiler):
    engine = make_engine(tiny_model_dir)
    regex = Sequence([5, 6, 7], SamplingParams(max_tokens=30, temperature=1.0, seed=3))
    regex.grammar = compiler.matcher("regex", r"[0-9]{3}-[a-z]{2}")
    lark = Sequence([5, 6, 7], SamplingParams(max_tokens=30, temperature=1.0, seed=4))
    lark.grammar = compiler.matcher("lark", 'start: ("yes" | "no") "!"')
    run(engine, [regex, lark])
    import re

    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", tokenizer.decode(regex.output_ids))
    assert tokenizer.decode(lark.output_ids) in ("yes!", "no!")


@pytest.mark.parametrize(
    ("guide_type", "guide"), [("json_schema", "{not json"), ("regex", "(unclosed"), ("xml", ""), ("lark", "start: (")]
)
def test_bad_guides_are_errors_naming_the_tensor(compiler, guide_type, guide):
    with pytest.raises(ValueError, match="guided_decoding_guide"):
        compiler.matcher(guide_type, guide)


@pytest.mark.parametrize(
    ("temperature", "repetition_penalty"),
    [(float("inf"), 1.0), (1e-45, 1.0), (1.0, float("inf")), (float("inf"), float("inf"))],
    ids=["temperature-overflow", "temperature-underflow", "penalty-overflow", "both"],
)
def test_extreme_parameters_still_sample_what_the_grammar_allows(
    tiny_model_dir, tokenizer, compiler, temperature, repetition_penalty
):
    """Values a FP32 tensor rounds to inf or 0 (e.g. temperature 1e39) once overflowed the sampler."""
    engine = make_engine(tiny_model_dir)
    params = SamplingParams(
        max_tokens=60,
        temperature=temperature,
        repetition_penalty=repetition_penalty,
        seed=1,
        end_id=tokenizer.eos_token_id,
    )
    seq = Sequence(random_prompts(1, seed=22, max_len=10)[0], params)
    seq.grammar = compiler.matcher("lark", 'start: ("yes" | "no") "!"')
    run(engine, [seq])
    assert seq.finish_reason is FinishReason.END_ID
    assert tokenizer.decode(seq.output_ids, skip_special_tokens=True) in ("yes!", "no!")
