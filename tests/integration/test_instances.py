"""Scaling out inside one tritonserver.

Two llm instances (`serve --llm-instances 2`): Triton spreads the requests over two engines, each with its own
KV pool; a stop request reaches the engine that runs the generation, whichever instance Triton hands it to;
each instance's metrics carry its name; a LoRA adapter sent once serves its task id on both. `make
test-instances` runs the whole integration suite, the cancellation storm included, on such a server.

One llm split over two processes (`serve --tensor-parallel-size 2`): greedy output as transformers'."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import launch_triton
from oracles import greedy_ids, merged, random_adapter
from triton_helpers import Stream, metric, metric_series, tensor, wait_for

from tritonllm.launcher.cli import build_parser

from .test_triton import llm_inputs, send_stop

INSTANCES = 2


@pytest.fixture(scope="module")
def triton(tiny_model_dir, tmp_path_factory):
    """Overrides the session's server for this module's tests (and their `stream` fixture)."""
    server = launch_triton(tiny_model_dir, tmp_path_factory.mktemp("instances"), llm_instances=INSTANCES)
    yield server
    server.stop()


def generate(server, ids: list[int], max_tokens: int, extra: list | None = None) -> list[int]:
    """One non-streamed request to `llm` on a stream of its own (concurrent calls go out together)."""
    s = Stream(server.grpc_url)
    try:
        s.send("llm", [*llm_inputs(ids, max_tokens, streaming=False), *(extra or [])])
        return s.until_final()[-1].as_numpy("output_ids").reshape(-1).tolist()
    finally:
        s.close()


def instances_with(triton, name: str) -> set[str]:
    return {instance for instance, value in metric_series(triton, name) if value > 0}


def test_requests_spread_over_both_engines_and_each_equals_transformers(triton, hf_model):
    prompts = [[3 + i, 17, 250 + 7 * i, 9, 41 + i] for i in range(12)]
    expected = [greedy_ids(hf_model, ids, 12) for ids in prompts]
    with ThreadPoolExecutor(12) as pool:
        assert list(pool.map(lambda ids: generate(triton, ids, 12), prompts)) == expected
    assert len(instances_with(triton, "tritonllm_generation_tokens_total")) == INSTANCES


def test_stops_reach_the_instance_running_each_generation(triton, stream):
    """Eight generations on two engines; each stop goes to whichever instance Triton picks."""
    cancelled = 'reason="cancelled"'
    assert wait_for(lambda: metric(triton, "tritonllm_requests_running") == 0)  # no gauge left from before
    before = dict(metric_series(triton, "tritonllm_requests_finished_total", cancelled))
    stopper = stream()  # opened first: all eight stops go down this one stream, each as soon as its generation runs
    streams = []
    for i in range(8):
        s = stream()
        s.send("llm", llm_inputs([5 + i, 6, 7, 8], 1900), request_id=f"spread-{i}")
        streams.append(s)
    for i, s in enumerate(streams):  # a first token: it runs, and 1899 more take the tiny model a second or more
        assert not s.next().as_numpy("finish_reason").item()
        stopper.send("llm", [tensor("stop", [[True]], "BOOL")], request_id=f"spread-{i}")
    for s in streams:
        last = s.until_final()[-1]
        assert last.as_numpy("finish_reason").item() == b"cancelled"
    assert wait_for(lambda: metric(triton, "tritonllm_requests_finished_total", cancelled) == sum(before.values()) + 8)
    after = dict(metric_series(triton, "tritonllm_requests_finished_total", cancelled))
    assert all(after[instance] > before.get(instance, 0) for instance in after) and len(after) == INSTANCES
    for instance, _ in metric_series(triton, "tritonllm_kv_blocks_used"):
        assert wait_for(lambda i=instance: metric(triton, "tritonllm_kv_blocks_used", instance=i) == 0)


def test_each_instance_reports_its_own_metrics(triton):
    series = metric_series(triton, "tritonllm_kv_blocks_free")
    assert len({instance for instance, _ in series}) == INSTANCES
    assert all(value > 0 for _, value in series)


def test_a_lora_adapter_sent_once_serves_its_task_id_on_every_instance(triton, hf_model):
    weights, config, deltas = random_adapter(hf_model, 5)
    prompt = [11, 250, 3000, 42, 7]
    expected = greedy_ids(merged(hf_model, deltas), prompt, 8)
    task = tensor("lora_task_id", [[91]], "UINT64")
    first = [task, tensor("lora_weights", weights[None], "FP32"), tensor("lora_config", config[None], "INT32")]
    assert generate(triton, prompt, 8, first) == expected
    with ThreadPoolExecutor(8) as pool:  # the task id alone, on whichever instance Triton picks
        assert list(pool.map(lambda _: generate(triton, prompt, 8, [task]), range(8))) == [expected] * 8


@pytest.fixture(scope="module")
def split_triton(tiny_model_dir, tmp_path_factory):
    settings = {"tensor_parallel_size": "2"}
    server = launch_triton(tiny_model_dir, tmp_path_factory.mktemp("split"), settings=settings)
    yield server
    server.stop()


def test_a_tensor_parallel_llm_through_triton_equals_transformers(split_triton, hf_model):
    prompts = [[3 + i, 17, 250 + 7 * i, 9, 41 + i] * (1 + i) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda ids: generate(split_triton, ids, 10), prompts))
    assert outputs == [greedy_ids(hf_model, ids, 10) for ids in prompts]


def test_drain_waits_while_an_engine_runs_and_returns_once_both_are_idle(triton, stream):
    """`tritonllm drain`, the pod's preStop hook: tritonserver must outlive the streams it still serves."""
    drain = build_parser().parse_args(["drain", "--metrics-url", triton.metrics_url, "--quiet-seconds", "0.5"])
    s = stream()
    s.send("llm", llm_inputs([5, 6, 7, 8], 1900, streaming=False), request_id="draining")
    assert wait_for(lambda: metric(triton, "tritonllm_requests_running") == 1)
    drain.timeout = 1.0
    assert drain.func(drain) == 1  # still running when the time is up
    send_stop(stream, "draining")
    s.until_final()
    drain.timeout = 30.0
    assert drain.func(drain) == 0
