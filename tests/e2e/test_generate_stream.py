"""`generate_stream` and `generate` in the format of the spec, over raw HTTP."""

from __future__ import annotations

import json

import httpx
import pytest
from oracles import greedy_text

from .conftest import MODEL


def sse_events(shim_url: str, body: dict) -> list[dict]:
    # No Content-Type, as the spec's curl examples send it.
    with httpx.stream(
        "POST", f"{shim_url}/v2/models/{MODEL}/generate_stream", content=json.dumps(body), timeout=60
    ) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    blocks = [b for b in raw.split("\n\n") if b]
    events = [json.loads(b[len("data:") :]) for b in blocks]
    # Compact JSON right after "data:", as in the spec's examples.
    assert blocks == ["data:" + json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in events]
    return events


def test_events_follow_the_spec_and_join_to_the_generate_text(shim_url, tokenizer, hf_model):
    prompt = "My name is Olivier and I"
    expected, ids = greedy_text(hf_model, tokenizer, tokenizer.encode(prompt), 20)
    body = {"id": "a123", "text_input": prompt, "parameters": {"details": True, "max_new_tokens": 20}}
    events = sse_events(shim_url, body)
    whole = httpx.post(f"{shim_url}/v2/models/{MODEL}/generate", content=json.dumps(body), timeout=60).json()

    assert "".join(e["text_output"] for e in events) == whole["text_output"] == expected
    for i, e in enumerate(events):
        assert list(e) == ["id", "model_name", "model_version", "text_output", "details", "prefill_time", "decode_time"]
        assert e["id"] == "a123" and e["model_name"] == MODEL and e["model_version"] is None
        d = e["details"]
        assert {"generated_tokens", "first_token_cost", "decode_cost", "batch_size", "queue_wait_time"} <= set(d)
        assert d["first_token_cost"] is None and d["decode_cost"] is None and d["batch_size"] >= 1
        assert ("finish_reason" in d) == (i == len(events) - 1)
        assert (e["prefill_time"] is not None) == (i == 0) and (e["decode_time"] is not None) == (i > 0)
    assert events[-1]["details"]["finish_reason"] == ("eos_token" if len(ids) < 20 else "length")
    assert events[-1]["details"]["generated_tokens"] == len(ids)


def test_details_are_left_out_unless_asked(shim_url):
    events = sse_events(shim_url, {"text_input": "Hi", "parameters": {"max_new_tokens": 3}})
    assert all("details" not in e for e in events)


def test_max_new_tokens_defaults_to_20(shim_url):
    whole = httpx.post(
        f"{shim_url}/v2/models/{MODEL}/generate", json={"text_input": "Hi", "parameters": {"details": True}}, timeout=60
    ).json()
    assert whole["details"]["generated_tokens"] <= 20
    if whole["details"]["finish_reason"] == "length":
        assert whole["details"]["generated_tokens"] == 20


def test_seeded_sampling_repeats(shim_url):
    body = {"text_input": "Hi", "parameters": {"do_sample": True, "seed": 5, "temperature": 0.9, "max_new_tokens": 12}}
    first = httpx.post(f"{shim_url}/v2/models/{MODEL}/generate", json=body, timeout=60).json()["text_output"]
    again = httpx.post(f"{shim_url}/v2/models/{MODEL}/generate", json=body, timeout=60).json()["text_output"]
    assert first == again


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "bad id!", "text_input": "x"}, "id"),
        ({"id": "x" * 257, "text_input": "x"}, "id"),
        ({"text_input": ""}, "text_input"),
        ({"text_input": [{"type": "text", "text": "x"}]}, "text_input"),
        ({"text_input": "x", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"text_input": "x", "parameters": {"temperature": 0}}, "temperature"),
        ({"text_input": "x", "parameters": {"top_p": 0}}, "top_p"),
        ({"text_input": "x", "parameters": {"top_k": -1}}, "top_k"),
        ({"text_input": "x", "parameters": {"seed": 0}}, "seed"),
        ({"text_input": "x", "parameters": {"priority": 6}}, "priority"),
        ({"text_input": "x", "parameters": {"timeout": 3601}}, "timeout"),
        ({"text_input": "x", "parameters": {"typical_p": 1.5}}, "typical_p"),
        ({"text_input": "x", "parameters": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"text_input": "x", "parameters": {"bogus": 1}}, "bogus"),
    ],
)
def test_bad_requests_get_400_naming_the_field(shim_url, body, field):
    r = httpx.post(f"{shim_url}/v2/models/{MODEL}/generate_stream", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]
