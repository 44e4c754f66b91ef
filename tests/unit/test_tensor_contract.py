"""The tensor names and types that cross a boundary agree on both sides: what the shim sends and what the
ensemble declares, what each ensemble step maps and what its model declares, what the engine reads and what
`llm` declares. A parameter renamed or retyped in one place and not the other fails here, not in production."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import REPOSITORY

from tritonllm.engine.state import inference_request
from tritonllm.shim.triton_requests import GenerationRequest, TokenizeRequest

WIRE_TYPES = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64"}
WIRE_TYPES |= {"TYPE_UINT64": "UINT64", "TYPE_UINT8": "UINT8", "TYPE_FP32": "FP32", "TYPE_FP16": "FP16"}


def declared(model: str, kind: str) -> dict[str, str]:
    """A model's inputs or outputs by name, with their wire data types."""
    text = (REPOSITORY / model / "config.pbtxt").read_text()
    block = re.search(rf"^{kind} \[(.*?)^\]", text, re.DOTALL | re.MULTILINE).group(1)
    return {n: WIRE_TYPES[t] for n, t in re.findall(r'name: "(\w+)" data_type: (TYPE_\w+)', block)}


def ensemble_steps() -> list[tuple[str, dict[str, str], dict[str, str]]]:
    text = (REPOSITORY / "ensemble" / "config.pbtxt").read_text()
    steps = []
    for body in re.findall(r"\{\s*model_name: (.*?)\n    \}", text, re.DOTALL):
        model = re.match(r'"(\w+)"', body).group(1)
        inputs = dict(re.findall(r'input_map \{ key: "(\w+)" value: "(\w+)" \}', body))
        outputs = dict(re.findall(r'output_map \{ key: "(\w+)" value: "(\w+)" \}', body))
        steps.append((model, inputs, outputs))
    return steps


def every_field_set() -> GenerationRequest:
    return GenerationRequest(
        max_tokens=4,
        max_tokens_must_fit=True,
        messages=[{"role": "user", "content": "x"}],
        tools=[{"type": "function"}],
        add_generation_prompt=False,
        continue_final_message=True,
        chat_template_kwargs={"enable_thinking": False},
        chat_template="{{ messages }}",
        thinking_budget=4,
        thinking_open=True,
        temperature=0.5,
        top_k=3,
        top_p=0.9,
        typical_p=0.9,
        seed=1,
        repetition_penalty=1.1,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        watermark=True,
        stop_token_ids=[1],
        logit_bias={1: 1.0},
        include_stop_str_in_output=True,
        skip_special_tokens=True,
        ignore_eos=True,
        use_raw_prompt=True,
        truncate_prompt=True,
        prediction="x",
        num_samples=2,
        beam_width=2,
        logprobs=True,
        top_logprobs=2,
        prompt_logprobs=True,
        guide=("json", "{}"),
        priority=1,
        timeout_ms=10,
    )


@pytest.mark.parametrize(
    "request_",
    [every_field_set(), GenerationRequest(max_tokens=4, text="x"), GenerationRequest(max_tokens=4, prompt_ids=[1])],
    ids=["every-field", "text", "token-ids"],
)
def test_what_the_shim_sends_the_ensemble_declares_with_the_same_types(request_):
    ensemble = declared("ensemble", "input")
    sent = {tensor.name(): tensor.datatype() for tensor in request_.inputs()}
    assert {name: ensemble.get(name) for name in sent} == sent


def test_what_the_shim_sends_preprocessing_alone_it_declares():
    preprocessing = declared("preprocessing", "input")
    for request in (TokenizeRequest(text="x"), TokenizeRequest(messages=[{"role": "user", "content": "x"}])):
        sent = {tensor.name(): tensor.datatype() for tensor in request.inputs()}
        assert {name: preprocessing.get(name) for name in sent} == sent


def test_every_ensemble_step_maps_tensors_its_model_declares_with_the_same_types():
    ensemble_in, ensemble_out = declared("ensemble", "input"), declared("ensemble", "output")
    produced = dict(ensemble_in)  # ensemble tensor -> its wire type, as the steps make them
    for model, inputs, outputs in ensemble_steps():
        model_in, model_out = declared(model, "input"), declared(model, "output")
        for name, value in outputs.items():
            assert name in model_out, f"{model} has no output {name}"
            produced[value] = model_out[name]
        for name, value in inputs.items():
            assert name in model_in, f"{model} has no input {name}"
            assert value in produced, f"{model}'s input {name} maps {value}, which nothing produces"
            assert produced[value] == model_in[name], f"{model}.{name}: {model_in[name]}, mapped from {produced[value]}"
    for name, wire in ensemble_out.items():
        assert produced.get(name) == wire, f"the ensemble's output {name} is not produced as {wire}"
    unused = set(ensemble_in) - {v for _, inputs, _ in ensemble_steps() for v in inputs.values()}
    assert not unused, f"ensemble inputs no step takes: {sorted(unused)}"


def test_every_tensor_the_engine_reads_llm_declares():
    asked: set[str] = set()

    def get(name: str):
        asked.add(name)
        required = {"input_ids": np.array([[1, 2]], dtype=np.int32), "request_output_len": np.array([[2]], np.int32)}
        return required.get(name)

    inference_request.parse(get, vocab_size=10)
    assert asked - set(declared("llm", "input")) == set()
