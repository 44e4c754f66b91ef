"""The shim's direct route (preprocessing, then llm, detokenized in the shim) against the ensemble's answers."""

from __future__ import annotations

import pytest
from triton_helpers import metric

from tritonllm.shim.settings import ShimSettings

from .conftest import MODEL, running_shim

ENSEMBLE_SUCCESS = ("nv_inference_request_success", 'model="ensemble"')
LLM_SUCCESS = ("nv_inference_request_success", 'model="llm"')


@pytest.fixture(scope="module")
def ensemble_client(triton):
    from openai import OpenAI

    settings = ShimSettings(triton_grpc_url=triton.grpc_url, served_model_name=MODEL, through_ensemble=True)
    with running_shim(settings) as url:
        yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _streamed_chat(client, **request) -> dict:
    """Each choice's joined text, token log-probs (with alternatives) and finish reason, and the usage."""
    choices: dict[int, dict] = {}
    usage = None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **request):
        usage = chunk.usage or usage
        for c in chunk.choices:
            seen = choices.setdefault(c.index, {"text": "", "logprobs": [], "finish_reason": None})
            seen["text"] += c.delta.content or ""
            seen["finish_reason"] = c.finish_reason or seen["finish_reason"]
            for t in (c.logprobs.content or []) if c.logprobs else []:
                seen["logprobs"].append((t.token, t.bytes, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]))
    return {"choices": choices, "usage": usage.model_dump(exclude={"queue_wait_time"}) if usage else None}


def test_direct_streams_equal_the_ensembles(triton, openai_client, ensemble_client):
    request = {
        "messages": [{"role": "user", "content": "Schreib ein Gedicht über Ünïcödé 🙂 und 中文"}],
        "max_tokens": 24,
        "n": 2,
        "seed": 7,
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 3,
        "stream_options": {"include_usage": True},
    }
    through_ensemble = metric(triton, *ENSEMBLE_SUCCESS)
    via_ensemble = _streamed_chat(ensemble_client, **request)
    assert metric(triton, *ENSEMBLE_SUCCESS) == through_ensemble + 1

    before = metric(triton, *ENSEMBLE_SUCCESS), metric(triton, *LLM_SUCCESS)
    direct = _streamed_chat(openai_client, **request)
    # the direct route: the llm served it, the ensemble did not see it
    assert metric(triton, *ENSEMBLE_SUCCESS) == before[0]
    assert metric(triton, *LLM_SUCCESS) > before[1]

    assert direct == via_ensemble
    assert all(len(c["logprobs"]) == direct["usage"]["completion_tokens"] // 2 for c in direct["choices"].values())


def test_direct_completion_with_prompt_logprobs_equals_the_ensembles(openai_client, ensemble_client):
    request = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "echo": True, "logprobs": 2}
    request["temperature"] = 0
    timings = {"id": True, "created": True, "decode_time_arr": True, "prefill_time": True, "usage": {"queue_wait_time"}}
    direct = openai_client.completions.create(**request).model_dump(exclude=timings)
    via_ensemble = ensemble_client.completions.create(**request).model_dump(exclude=timings)
    assert direct == via_ensemble
    assert direct["choices"][0]["logprobs"]["tokens"]  # the prompt's tokens and the answer's


def test_direct_route_errors_are_the_ensembles(openai_client, ensemble_client):
    from openai import BadRequestError

    errors = []
    for client in (openai_client, ensemble_client):
        with pytest.raises(BadRequestError) as caught:  # refused by preprocessing
            client.completions.create(model=MODEL, prompt=[10**7], max_tokens=4)
        errors.append(caught.value.body)
    assert errors[0] == errors[1]
    assert "10000000" in errors[0]["message"]
