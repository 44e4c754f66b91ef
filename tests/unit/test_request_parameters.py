"""Each declared request parameter (tritonllm/common/request_parameters.py) is what the configs, the docs, the engine
and the shim use: a parameter declared but not generated, not read, or not sent fails here."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tritonllm.common.errors import RequestError
from tritonllm.common.request_parameters import PARAMETERS, Parameter, read
from tritonllm.engine.state import inference_request
from tritonllm.launcher import parameter_configs
from tritonllm.shim.triton_requests import NUMPY_TYPES, GenerationRequest

REQUIRED = {"input_ids": np.array([[1, 2]], dtype=np.int32), "request_output_len": np.array([[2]], np.int32)}
CANDIDATES = {"INT32": [-2, -1, 0, 1, 2, 100], "FP32": [-1.0, 0.0, 0.5, 1.0, 1.5, float("inf")]}
# GenerationRequest fields that are not declared parameters: the prompt, and what preprocessing or the shim's
# own structure takes (samples and beams change how many responses come back)
UNDECLARED_FIELDS = {
    "max_tokens", "max_tokens_must_fit", "text", "prompt_ids", "messages", "tools", "stop_token_ids", "logit_bias",
    "ignore_eos", "use_raw_prompt", "truncate_prompt", "truncate_prompt_tokens", "truncation_side", "num_samples",
    "beam_width", "guide", "stream", "request_id", "prediction", "add_generation_prompt", "continue_final_message",
    "add_special_tokens", "chat_template_kwargs", "chat_template", "thinking_open", "lora", "lora_weights_attached",
    "model",
}  # fmt: skip


def tensor(p: Parameter, value) -> np.ndarray:
    if p.wire == "BYTES":
        return np.array([[value.encode()]], dtype=np.object_)
    return np.array([[value]], dtype=NUMPY_TYPES[p.wire])


def by(p: Parameter, holds: bool) -> list:
    return [v for v in CANDIDATES.get(p.wire, []) if p.rule.holds(v) == holds]


@pytest.mark.parametrize("path", list(parameter_configs.SECTIONS))
def test_the_generated_sections_are_up_to_date(path):
    text = (parameter_configs.ROOT / path).read_text()
    assert parameter_configs.generated(path) == text, f"{path} is stale: run `make configs`"


def test_the_engine_reads_every_declared_parameter():
    asked: set[str] = set()

    def get(name: str):
        asked.add(name)
        return REQUIRED.get(name)

    inference_request.parse(get, vocab_size=10, hidden_size=4)
    assert {p.name for p in PARAMETERS} - asked == set()


@pytest.mark.parametrize("p", PARAMETERS, ids=lambda p: p.name)
def test_absent_gives_the_default_and_a_value_comes_back_typed(p):
    assert read(lambda _: None, p.name) == p.default
    for value in by(p, holds=True) or ([True] if p.wire == "BOOL" else []):
        got = read(lambda name, v=value: tensor(p, v) if name == p.name else None, p.name)
        assert got == value and type(got) is type(value)


@pytest.mark.parametrize("p", [p for p in PARAMETERS if by(p, holds=False)], ids=lambda p: p.name)
def test_a_value_against_the_rule_is_refused_by_the_engine_naming_the_tensor(p):
    bad = by(p, holds=False)[0]
    with pytest.raises(RequestError) as refused:
        inference_request.parse(lambda name: tensor(p, bad) if name == p.name else REQUIRED.get(name), 10)
    assert refused.value.param == p.name and p.rule.text in refused.value.message


def test_every_generation_request_field_is_declared_or_known():
    fields = {f.name for f in dataclasses.fields(GenerationRequest)}
    declared = {p.field for p in PARAMETERS if p.field}
    assert declared - fields == set(), "declared fields GenerationRequest lacks"
    assert fields - declared - UNDECLARED_FIELDS == set(), "fields to declare in tritonllm/common/request_parameters.py"


@pytest.mark.parametrize("p", [p for p in PARAMETERS if p.field], ids=lambda p: p.name)
def test_the_shim_sends_a_declared_field_under_its_ensemble_name(p):
    value = (by(p, holds=True) or [True])[-1]
    sent = {t.name(): t.datatype() for t in GenerationRequest(max_tokens=1, **{p.field: value}).inputs()}
    assert sent.get(p.ensemble_name) == p.wire
