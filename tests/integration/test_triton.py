"""The model repository on a real tritonserver, through real tritonclient gRPC and Triton's HTTP API."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from oracles import beam_search, greedy_ids, greedy_text, merged, prompt_tuned_greedy, random_adapter
from triton_helpers import Stream, metric, pause_llm, tensor, wait_for
from tritonclient.utils import InferenceServerException

from tritonllm.tokenizer.detokenizer import CONTEXT_TOKENS, text_increment
from tritonllm.tokenizer.postprocess import CONDITIONAL
from tritonllm.tokenizer.word_lists import encode_word_list

PROMPTS = ["Hello 你好", "The quick brown fox", "😀 emoji 🎉 and", "数据 model token batch"]


def ensemble_inputs(text: str, max_tokens: int, stream: bool = True) -> list:
    """A whole answer without the prompt (TensorRT-LLM's default would start it with the prompt)."""
    return [
        tensor("text_input", [[text.encode()]], "BYTES"),
        tensor("max_tokens", [[max_tokens]], "INT32"),
        tensor("stream", [[stream]], "BOOL"),
        *([] if stream else [tensor("exclude_input_in_output", [[True]], "BOOL")]),
    ]


def llm_inputs(ids: list[int], max_tokens: int, streaming: bool = True) -> list:
    return [
        tensor("input_ids", [ids], "INT32"),
        tensor("request_output_len", [[max_tokens]], "INT32"),
        tensor("streaming", [[streaming]], "BOOL"),
    ]


def text_of(results) -> str:
    return "".join(r.as_numpy("text_output").reshape(-1)[0].decode() for r in results)


def test_tritonserver_and_every_stub_run_on_tcmalloc(triton):
    """Preloaded by server_env (launcher/allocator.py): glibc's malloc took a quarter of tritonserver's CPU."""
    stubs = {model: triton.stubs_of(model) for model in ("preprocessing", "llm", "postprocessing", "embedding")}
    assert all(stubs.values()), stubs
    for pid in [triton.process.pid, *(pid for pids in stubs.values() for pid in pids)]:
        assert "libtcmalloc" in Path(f"/proc/{pid}/maps").read_text(), f"process {pid} runs without tcmalloc"


def test_ensemble_grpc_stream_equals_transformers_and_non_stream(stream, tokenizer, hf_model):
    prompt = PROMPTS[0]
    expected, ids = greedy_text(hf_model, tokenizer, tokenizer.encode(prompt), 24)
    s = stream()
    s.send("ensemble", ensemble_inputs(prompt, 24), request_id="ens-1")
    streamed = s.until_final()
    s.send("ensemble", ensemble_inputs(prompt, 24, stream=False), request_id="ens-2")
    whole = s.until_final()
    assert len(whole) == 1
    assert text_of(streamed) == text_of(whole) == expected
    last = streamed[-1]
    assert last.as_numpy("num_output_tokens").item() == len(ids)
    assert last.as_numpy("num_input_tokens").item() == len(tokenizer.encode(prompt))
    assert last.as_numpy("finish_reason").item().decode() == ("end_id" if len(ids) < 24 else "length")


def test_stream_interval_groups_the_tokens_and_keeps_the_text(stream, tokenizer, hf_model):
    prompt = PROMPTS[1]
    expected, ids = greedy_text(hf_model, tokenizer, tokenizer.encode(prompt), 24)
    s = stream()
    s.send("ensemble", [*ensemble_inputs(prompt, 24), tensor("stream_interval", [[5]], "INT32")])
    streamed = s.until_final()
    assert text_of(streamed) == expected
    assert [t for r in streamed for t in r.as_numpy("output_ids").reshape(-1).tolist()] == ids
    sizes = [r.as_numpy("output_ids").size for r in streamed]
    # the first token at once, then groups of 5 (merged further if the server's sender fell behind), then the rest
    assert (sizes[0] - 1) % 5 == 0
    assert all(n and n % 5 == 0 for n in sizes[1:-1])
    assert len(streamed) <= 1 + -(-(len(ids) - 1) // 5)


def test_llm_grpc_ids_in_ids_out(stream, hf_model):
    prompt = [11, 250, 3000, 42, 7]
    expected = greedy_ids(hf_model, prompt, 16)
    s = stream()
    s.send("llm", llm_inputs(prompt, 16), request_id="llm-1")
    streamed = s.until_final()
    # one token a response, unless the server's sender had a backlog to merge
    assert [t for r in streamed for t in r.as_numpy("output_ids").reshape(-1).tolist()] == expected
    assert all(r.as_numpy("sequence_length").tolist() == [[r.as_numpy("output_ids").size]] for r in streamed)
    s.send("llm", llm_inputs(prompt, 16, streaming=False), request_id="llm-2")
    (whole,) = s.until_final()
    assert whole.as_numpy("output_ids").shape == (1, 1, 16)
    assert whole.as_numpy("output_ids").reshape(-1).tolist() == expected


def test_triton_http_generate_stream_on_the_ensemble(triton, tokenizer, hf_model):
    prompt = PROMPTS[2]
    expected, _ = greedy_text(hf_model, tokenizer, tokenizer.encode(prompt), 20)

    def post(route: str, body: dict) -> str:
        req = urllib.request.Request(f"{triton.http_url}/v2/models/ensemble/{route}", data=json.dumps(body).encode())
        return urllib.request.urlopen(req, timeout=60).read().decode()

    events = [
        json.loads(line[len("data:") :])
        for line in post("generate_stream", {"text_input": prompt, "max_tokens": 20, "stream": True}).splitlines()
        if line.startswith("data:")
    ]
    whole = json.loads(
        post("generate", {"text_input": prompt, "max_tokens": 20, "stream": False, "exclude_input_in_output": True})
    )
    assert "".join(e["text_output"] for e in events) == whole["text_output"] == expected
    assert events[-1]["finish_reason"] in ("length", "end_id")
    assert all(not e["finish_reason"] for e in events[:-1])


def test_32_concurrent_streams_complete_correctly_in_one_batch(triton, tokenizer, hf_model, pytestconfig):
    """The engine paused while the 32 requests arrive, so they run as one batch whatever the machine's speed."""
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(32)]
    expected = [greedy_text(hf_model, tokenizer, tokenizer.encode(p), 32)[0] for p in prompts]
    one_instance = pytestconfig.getoption("--llm-instances") == 1  # else each instance takes a share

    def one(i: int) -> tuple[str, int]:
        s = Stream(triton.grpc_url)
        try:
            s.send("ensemble", ensemble_inputs(prompts[i], 32), request_id=f"many-{i}")
            results = s.until_final()
        finally:
            s.close()
        return text_of(results), max(r.as_numpy("batch_size").item() for r in results)

    pause_llm(triton.grpc_url, True)
    try:
        with ThreadPoolExecutor(32) as pool:
            running = [pool.submit(one, i) for i in range(32)]
            if one_instance:
                assert wait_for(lambda: metric(triton, "tritonllm_requests_waiting") == 32, timeout=60)
            pause_llm(triton.grpc_url, False)
            outcomes = [r.result() for r in running]
    finally:
        pause_llm(triton.grpc_url, False)
    assert [text for text, _ in outcomes] == expected
    batches = [batch for _, batch in outcomes]
    assert max(batches) == 32 if one_instance else max(batches) > 1


def blocks_released(triton) -> bool:
    return metric(triton, "tritonllm_kv_blocks_used") == 0 and metric(triton, "tritonllm_requests_running") == 0


def cancelled_count(triton) -> float:
    return metric(triton, "tritonllm_requests_finished_total", 'reason="cancelled"')


def long_running(triton, stream, model: str, inputs: list, request_id: str) -> Stream:
    """A stream of a 1900-token generation that the engine is running. `min_tokens` holds off the end id: a random
    model's greedy text can reach it within a few tokens, and the generation would end before the test ends it."""
    s = stream()
    s.send(model, [*inputs, tensor("min_tokens", [[1900]], "INT32")], request_id=request_id)
    assert wait_for(lambda: metric(triton, "tritonllm_kv_blocks_used") > 0)
    return s


def send_stop(stream, request_id: str) -> None:
    stream().send("llm", [tensor("stop", [[True]], "BOOL")], request_id=request_id)


# The cancelled requests do not stream: tritonserver 2.51 can crash when a gRPC cancellation meets a response
# being completed (see docs/tensors.md), so no response is in flight when these tests cancel.


def test_cancelling_a_direct_llm_stream_frees_its_blocks(triton, stream):
    before = cancelled_count(triton)
    s = long_running(triton, stream, "llm", llm_inputs([5, 6, 7, 8], 1900, streaming=False), "cancel-direct")
    s.cancel()
    assert wait_for(lambda: cancelled_count(triton) == before + 1)
    assert wait_for(lambda: blocks_released(triton))


def test_stop_request_ends_an_ensemble_stream_with_a_final_response(triton, stream):
    before = cancelled_count(triton)
    s = long_running(triton, stream, "ensemble", ensemble_inputs("Hello", 1900), "cancel-ensemble")
    send_stop(stream, "cancel-ensemble")
    last = s.until_final()[-1]
    assert last.as_numpy("finish_reason").item() == b"cancelled"
    assert last.as_numpy("num_output_tokens").item() < 1900
    # the metrics' own thread counts it, as the response goes out on another: it may come a moment later
    assert wait_for(lambda: cancelled_count(triton) == before + 1)
    assert wait_for(lambda: blocks_released(triton))


def test_a_cancelled_ensemble_stream_plus_stop_frees_its_blocks(triton, stream):
    """A cancelled stream does not reach the ensemble's steps; the stop request after it does."""
    before = cancelled_count(triton)
    s = long_running(triton, stream, "ensemble", ensemble_inputs("Hello", 1900, stream=False), "cancel-both")
    s.cancel()
    send_stop(stream, "cancel-both")
    assert wait_for(lambda: cancelled_count(triton) == before + 1)
    assert wait_for(lambda: blocks_released(triton))


@pytest.mark.parametrize(
    ("model", "inputs", "field"),
    [
        ("llm", llm_inputs([1, 2, 999999], 4), "input_ids"),
        ("llm", [tensor("input_ids", [[1, 2]], "INT32")], "request_output_len"),
        ("llm", [*llm_inputs([1, 2], 4), tensor("runtime_top_p", [[1.5]], "FP32")], "runtime_top_p"),
        ("llm", [*llm_inputs([1, 2], 4), tensor("stream_interval", [[0]], "INT32")], "stream_interval"),
        ("ensemble", ensemble_inputs("hi", 0), "max_tokens"),
        ("ensemble", [tensor("max_tokens", [[4]], "INT32")], "text_input"),
    ],
)
def test_bad_input_gets_an_error_naming_the_tensor(stream, model, inputs, field):
    s = stream()
    s.send(model, inputs)
    with pytest.raises(InferenceServerException, match=field):
        s.next()
    s.send("llm", llm_inputs([1, 2, 3], 2))
    assert sum(r.as_numpy("output_ids").size for r in s.until_final()) == 2  # the server keeps serving


def test_perf_analyzer_streams_against_the_ensemble(triton, tmp_path):
    data = Path(__file__).resolve().parents[2] / "client" / "perf_analyzer_input.json"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "tritonllm.launcher.cli", "perf-analyzer"),
            *("-m", "ensemble", "-i", "grpc", "-u", triton.grpc_url, "--streaming"),
            *("--input-data", str(data), "--concurrency-range", "4"),
            # Three windows of 8 requests each: perf_analyzer needs three to call a measurement stable.
            *("--measurement-mode", "count_windows", "--measurement-request-count", "8"),
            *("--stability-percentage", "999"),
            *("--profile-export-file", str(tmp_path / "profile.json")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "throughput" in proc.stdout
    # Its export embeds raw response bytes; only the timestamps matter here.
    profile = json.loads((tmp_path / "profile.json").read_bytes().decode("utf-8", "replace"))
    requests = profile["experiments"][0]["requests"]
    # Streamed: several responses per request. How many varies: a sender that falls behind the engine merges a
    # stream's queued tokens into one response.
    assert requests and sum(len(r["response_timestamps"]) for r in requests) > 2 * len(requests)


def test_llm_processing_and_log_prob_tensors_equal_generate(stream, hf_model):
    prompt = [11, 250, 3000, 42, 7, 11, 250]
    free = greedy_ids(hf_model, prompt, 16)
    bad, stop = [[free[1]]], [[9999 % 4096, 17], [free[10]]]
    bias = np.zeros((1, 4096), dtype=np.float32)
    bias[0, free[3]] = -5.0
    extra = [
        tensor("repetition_penalty", [[1.3]], "FP32"),
        tensor("no_repeat_ngram_size", [[2]], "INT32"),
        tensor("bad_words_list", encode_word_list(bad)[None], "INT32"),
        tensor("stop_words_list", encode_word_list(stop)[None], "INT32"),
        tensor("embedding_bias", bias, "FP32"),
        tensor("return_log_probs", [[True]], "BOOL"),
        tensor("num_top_log_probs", [[2]], "INT32"),
        tensor("return_generation_logits", [[True]], "BOOL"),
        tensor("return_context_logits", [[True]], "BOOL"),
    ]
    ref = hf_model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=16,
        pad_token_id=0,
        eos_token_id=None,
        repetition_penalty=1.3,
        no_repeat_ngram_size=2,
        bad_words_ids=bad,
        sequence_bias={(free[3],): -5.0},
        output_logits=True,
        return_dict_in_generate=True,
    )
    expected = ref.sequences[0, len(prompt) :].tolist()
    if stop[1][0] in expected:  # the stop word ends the output right after it
        expected = expected[: expected.index(stop[1][0]) + 1]
    raw = torch.cat(ref.logits)[: len(expected)]
    s = stream()
    s.send("llm", [*llm_inputs(prompt, 16, streaming=False), *extra])
    (whole,) = s.until_final()
    assert whole.as_numpy("output_ids").reshape(-1).tolist() == expected
    logprobs = torch.log_softmax(raw, -1)[torch.arange(len(expected)), torch.tensor(expected)]
    assert np.allclose(whole.as_numpy("output_log_probs").reshape(-1), logprobs.numpy(), atol=1e-4)
    assert np.isclose(whole.as_numpy("cum_log_probs").item(), logprobs.sum().item(), atol=1e-3)
    assert whole.as_numpy("top_log_prob_ids").shape == (1, 1, len(expected), 2)
    assert np.allclose(whole.as_numpy("generation_logits")[0, 0], raw.numpy(), atol=1e-4)
    assert whole.as_numpy("context_logits").shape == (1, len(prompt), 4096)

    s.send("llm", [*llm_inputs(prompt, 16, streaming=True), *extra])
    streamed = s.until_final()
    # A busy server may coalesce several tokens into one response: compare the joined stream.
    assert np.concatenate([r.as_numpy("output_ids").reshape(-1) for r in streamed]).tolist() == expected
    joined_logprobs = np.concatenate([r.as_numpy("output_log_probs").reshape(-1) for r in streamed])
    assert np.allclose(joined_logprobs, logprobs.numpy(), atol=1e-4)
    assert streamed[-1].as_numpy("finish_reason").item() in (b"stop_words", b"length")


def test_ensemble_sends_each_conditional_output_only_where_it_says_something(stream, tokenizer):
    """A plain streamed answer's responses leave out every postprocess.CONDITIONAL output (stop_token but in the
    last); asked for log-probs and the prompt's, each response has its tokens' log-probs and only the first the
    prompt's: an optional input the llm left out is not handed on stale from an earlier response."""
    s = stream()
    # 32 tokens: several responses, though a sender that falls behind may merge some (backend/coalesce.py)
    s.send("ensemble", [*ensemble_inputs(PROMPTS[1], 32), tensor("ignore_eos", [[True]], "BOOL")])
    plain = s.until_final()
    for i, response in enumerate(plain):
        sent = {name for name in CONDITIONAL if response.as_numpy(name) is not None}
        assert sent == ({"stop_token"} if i == len(plain) - 1 else set()), i
        assert response.as_numpy("token_texts").size == response.as_numpy("output_ids").size
    assert plain[-1].as_numpy("stop_token").item() == -1

    s.send(
        "ensemble",
        [
            *ensemble_inputs(PROMPTS[1], 32),
            tensor("ignore_eos", [[True]], "BOOL"),
            tensor("return_log_probs", [[True]], "BOOL"),
            tensor("num_top_log_probs", [[2]], "INT32"),
            tensor("return_prompt_log_probs", [[True]], "BOOL"),
        ],
    )
    asked = s.until_final()
    assert [r.as_numpy("prompt_log_probs_json") is not None for r in asked] == [True] + [False] * (len(asked) - 1)
    for response in asked:
        tokens = response.as_numpy("output_ids").size
        assert response.as_numpy("output_log_probs").shape == (1, 1, tokens)
        assert response.as_numpy("top_token_ids").shape == response.as_numpy("top_token_texts").shape == (1, tokens, 2)

    s.send("ensemble", [*ensemble_inputs(PROMPTS[1], 32), tensor("return_prompt_ids", [[True]], "BOOL")])
    with_ids = s.until_final()
    assert with_ids[0].as_numpy("prompt_ids").reshape(-1).tolist() == tokenizer.encode(PROMPTS[1])
    assert [r.as_numpy("prompt_ids") is None for r in with_ids[1:]] == [True] * (len(with_ids) - 1)


def test_timeout_ms_ends_a_generation_with_timeout(triton, stream):
    s = stream()
    s.send("llm", [*llm_inputs([5, 6, 7], 1900), tensor("timeout_ms", [[300]], "INT32")])
    last = s.until_final()[-1]
    assert last.as_numpy("finish_reason").item() == b"timeout"
    assert last.as_numpy("num_output_tokens").item() < 1900
    assert wait_for(lambda: blocks_released(triton))


def test_priority_out_of_range_is_an_error_naming_it(stream):
    s = stream()
    s.send("ensemble", [*ensemble_inputs("hi", 4), tensor("priority", [[9]], "INT32")])
    with pytest.raises(InferenceServerException, match="priority"):
        s.next()


def test_metrics_count_tokens_latencies_and_prefix_hits(triton, stream, pytestconfig):
    if pytestconfig.getoption("--llm-instances") > 1:
        pytest.skip("each instance has a prefix cache of its own, and Triton does not route requests by prefix")
    prompt = list(range(200, 264))  # 4 full blocks of 16
    before = {
        name: metric(triton, f"tritonllm_{name}")
        for name in (
            "prompt_tokens_total",
            "generation_tokens_total",
            "prefix_cache_hit_tokens_total",
            "time_to_first_token_seconds_count",
            "inter_token_latency_seconds_count",
            "queue_time_seconds_count",
        )
    }
    s = stream()
    for _ in range(2):  # the second request finds the first one's blocks
        s.send("llm", llm_inputs(prompt, 5))
        s.until_final()

    def grown(name: str) -> float:
        return metric(triton, f"tritonllm_{name}") - before[name]

    assert wait_for(lambda: grown("generation_tokens_total") == 10)
    assert grown("prompt_tokens_total") == 2 * len(prompt)
    assert grown("prefix_cache_hit_tokens_total") == 48  # 3 blocks; the last prompt token is always computed
    assert grown("time_to_first_token_seconds_count") == 2
    assert grown("inter_token_latency_seconds_count") == 8
    assert grown("queue_time_seconds_count") == 2
    for gauge in ("kv_blocks_free", "step_tokens", "engine_steps_total", "preemptions_total"):
        assert f"tritonllm_{gauge}" in urllib.request.urlopen(triton.metrics_url).read().decode()


def single_token_word(tokenizer, ids: list[int], start: int) -> tuple[str, int]:
    """A generated token whose text tokenizes back to exactly that token, from position `start` on."""
    for token in ids[start:]:
        word = tokenizer.decode([token])
        if word.strip() and tokenizer.encode(word, add_special_tokens=False) == [token]:
            return word, token
    raise AssertionError("no single-token word in the generation")


def test_ensemble_word_lists_penalties_and_bias_equal_generate(stream, tokenizer, hf_model):
    prompt = PROMPTS[3]
    prompt_ids = tokenizer.encode(prompt)
    free = greedy_ids(hf_model, prompt_ids, 24, eos=tokenizer.eos_token_id)
    bad_word, bad_token = single_token_word(tokenizer, free, 1)
    bias_word, bias_token = single_token_word(tokenizer, free, 3)
    inputs = [
        *ensemble_inputs(prompt, 24, stream=False),
        tensor("bad_words", [[bad_word.encode()]], "BYTES"),
        tensor("embedding_bias_words", [[bias_word.encode()]], "BYTES"),
        tensor("embedding_bias_weights", [[-3.0]], "FP32"),
        tensor("repetition_penalty", [[1.25]], "FP32"),
        tensor("no_repeat_ngram_size", [[2]], "INT32"),
    ]
    expected = hf_model.generate(
        torch.tensor([prompt_ids]),
        do_sample=False,
        max_new_tokens=24,
        pad_token_id=0,
        eos_token_id=tokenizer.eos_token_id,
        bad_words_ids=[[bad_token]],
        sequence_bias={(bias_token,): -3.0},
        repetition_penalty=1.25,
        no_repeat_ngram_size=2,
    )[0, len(prompt_ids) :].tolist()
    s = stream()
    s.send("ensemble", inputs)
    (whole,) = s.until_final()
    assert text_of([whole]) == text_increment(tokenizer, prompt_ids[-CONTEXT_TOKENS:], expected, final=True)
    assert whole.as_numpy("num_output_tokens").item() == len(expected)

    stop_word, stop_token = single_token_word(tokenizer, free, 5)
    s.send(
        "ensemble", [*ensemble_inputs(prompt, 24, stream=False), tensor("stop_words", [[stop_word.encode()]], "BYTES")]
    )
    (stopped,) = s.until_final()
    assert stopped.as_numpy("finish_reason").item() == b"stop_words"
    assert stopped.as_numpy("num_output_tokens").item() == free.index(stop_token) + 1


def test_several_samples_of_one_request_stream_with_their_index(stream):
    s = stream()
    inputs = [
        *llm_inputs([5, 6, 7, 8], 6),
        tensor("num_return_sequences", [[3]], "INT32"),
        tensor("runtime_top_k", [[50]], "INT32"),
        tensor("random_seed", [[11]], "UINT64"),
    ]
    s.send("llm", inputs)
    tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
    finished = set()
    while len(finished) < 3:
        result = s.next()
        index = result.as_numpy("sequence_index").item()
        tokens[index] += result.as_numpy("output_ids").reshape(-1).tolist()
        if result.as_numpy("finish_reason").item():
            finished.add(index)
    assert all(len(t) == 6 for t in tokens.values())
    assert len({tuple(t) for t in tokens.values()}) == 3
    with pytest.raises(queue.Empty):
        s.responses.get(timeout=0.5)  # nothing after the last sample's final response


def test_ensemble_samples_join_to_texts_per_index(stream):
    s = stream()
    s.send(
        "ensemble",
        [
            *ensemble_inputs("Hello 你好", 12),
            tensor("num_return_sequences", [[2]], "INT32"),
            tensor("temperature", [[1.0]], "FP32"),
            tensor("top_p", [[1.0]], "FP32"),  # a temperature alone decodes greedily, as in TensorRT-LLM
            tensor("random_seed", [[3]], "UINT64"),
        ],
    )
    texts, finished = {0: "", 1: ""}, set()
    while len(finished) < 2:
        result = s.next()
        index = result.as_numpy("sequence_index").item()
        texts[index] += result.as_numpy("text_output").reshape(-1)[0].decode()
        if result.as_numpy("finish_reason").item():
            finished.add(index)
    assert texts[0] != texts[1]


def test_draft_tokens_through_triton_give_the_same_greedy_output(stream, hf_model):
    prompt = [11, 250, 3000, 42, 7]
    expected = greedy_ids(hf_model, prompt, 10)
    s = stream()
    wrong = (expected[3] + 1) % 4096
    s.send("llm", [*llm_inputs(prompt, 10), tensor("draft_input_ids", [[*expected[:3], wrong]], "INT32")])
    results = s.until_final()
    first = results[0]
    # 3 accepted, plus one; a sender that fell behind may have merged the next steps' tokens into the response
    first_ids = first.as_numpy("output_ids").reshape(-1).tolist()
    assert len(first_ids) >= 4 and first_ids == expected[: len(first_ids)]
    assert first.as_numpy("num_accepted_draft_tokens").item() == 3
    assert [t for r in results for t in r.as_numpy("output_ids").reshape(-1).tolist()] == expected


def test_prompt_embedding_table_through_triton_equals_generate(stream, hf_model):
    hidden = hf_model.config.hidden_size
    table = torch.randn(3, hidden, generator=torch.Generator().manual_seed(9)).half()
    prompt = [4096, 4097, 4098, 300, 301]
    expected = prompt_tuned_greedy(hf_model, table, prompt, 8)
    s = stream()
    s.send(
        "llm",
        [
            *llm_inputs(prompt, 8, streaming=False),
            tensor("prompt_embedding_table", table.numpy()[None], "FP16"),
            tensor("prompt_vocab_size", [[3]], "INT32"),
        ],
    )
    (whole,) = s.until_final()
    assert whole.as_numpy("output_ids").reshape(-1).tolist() == expected
    s.send("llm", llm_inputs(prompt, 2))  # without the table those ids are outside the vocabulary
    with pytest.raises(InferenceServerException, match="input_ids"):
        s.next()


def test_lora_through_triton_equals_the_merged_weights(stream, hf_model):
    weights, config, deltas = random_adapter(hf_model, 5)
    prompt = [11, 250, 3000, 42, 7]
    expected = greedy_ids(merged(hf_model, deltas), prompt, 8)
    s = stream()
    lora = [
        tensor("lora_task_id", [[77]], "UINT64"),
        tensor("lora_weights", weights[None], "FP32"),
        tensor("lora_config", config[None], "INT32"),
    ]
    s.send("llm", [*llm_inputs(prompt, 8, streaming=False), *lora])
    assert s.until_final()[0].as_numpy("output_ids").reshape(-1).tolist() == expected
    s.send("llm", [*llm_inputs(prompt, 8, streaming=False), lora[0]])  # cached: the task id alone
    assert s.until_final()[0].as_numpy("output_ids").reshape(-1).tolist() == expected
    s.send("llm", [*llm_inputs(prompt, 8, streaming=False), tensor("lora_task_id", [[78]], "UINT64")])
    with pytest.raises(InferenceServerException, match="lora_task_id 78 is not cached"):
        s.next()


def test_llm_beam_search_equals_generate(stream, hf_model):
    prompt = [11, 250, 3000, 42, 7, 19]
    end_id = greedy_ids(hf_model, prompt, 4)[2]
    beams, scores = beam_search(hf_model, prompt, 3, 10, end_id, 0.8)
    s = stream()
    inputs = [
        *llm_inputs(prompt, 10),
        tensor("beam_width", [[3]], "INT32"),
        tensor("len_penalty", [[0.8]], "FP32"),
        tensor("end_id", [[end_id]], "INT32"),
        tensor("return_log_probs", [[True]], "BOOL"),
    ]
    s.send("llm", inputs, request_id="beams")
    (final,) = s.until_final()  # streaming or not, the beams come whole in one response
    lengths = final.as_numpy("sequence_length")[0].tolist()
    ids = final.as_numpy("output_ids")[0]
    assert ids.shape == (3, max(lengths))
    assert [row[:n].tolist() for row, n in zip(ids, lengths, strict=True)] == beams
    cum = final.as_numpy("cum_log_probs")[0]
    assert [c / n**0.8 for c, n in zip(cum, lengths, strict=True)] == pytest.approx(scores, abs=1e-4)
    assert final.as_numpy("output_log_probs").shape == (1, 3, max(lengths))


def test_ensemble_beam_search_returns_each_beam_as_text(stream, tokenizer, hf_model):
    prompt = "The quick brown fox"
    ids = tokenizer.encode(prompt)
    beams, _ = beam_search(hf_model, ids, 2, 8, tokenizer.eos_token_id, 1.0)
    s = stream()
    s.send("ensemble", [*ensemble_inputs(prompt, 8), tensor("beam_width", [[2]], "INT32")])
    (final,) = s.until_final()
    texts = [t.decode() for t in final.as_numpy("text_output").reshape(-1)]
    assert texts == [tokenizer.decode(b, skip_special_tokens=True) for b in beams]


def test_embedding_model_batches_requests_and_refuses_only_the_long_one(triton, sentence_model):
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    batches = [["first text", "second"], ["ok", "word " * 300], ["数据 and 😀"], ["query text"]]
    instructions = [None, None, None, "Represent this sentence: "]

    def embed(i: int):
        rows = [[t.encode()] for t in batches[i]]
        inputs = [tensor("text_input", rows, "BYTES")]
        if instructions[i]:
            inputs.append(tensor("instruction", [[instructions[i].encode()]] * len(rows), "BYTES"))
        try:
            result = client.infer("embedding", inputs)
        except InferenceServerException as e:
            return e
        return result.as_numpy("embedding"), result.as_numpy("num_input_tokens").reshape(-1)

    with ThreadPoolExecutor(len(batches)) as pool:
        results = list(pool.map(embed, range(len(batches))))
    assert isinstance(results[1], InferenceServerException)
    assert "text_input[1] has 302 tokens" in results[1].message()
    for i in (0, 2, 3):
        vectors, counts = results[i]
        expected = sentence_model.encode(batches[i], prompt=instructions[i])
        np.testing.assert_allclose(vectors, expected, atol=2e-6)
        full = [(instructions[i] or "") + t for t in batches[i]]
        assert counts.tolist() == [len(ids) for ids in sentence_model.tokenizer(full)["input_ids"]]


def test_exclude_input_in_output_as_tensorrt_llm_answers_it(stream, tokenizer, hf_model):
    """genai-perf sends true; false, or no tensor (the model's parameter, false as in TensorRT-LLM), starts a whole
    answer with the prompt; a streamed one never repeats it."""
    prompt_ids = tokenizer.encode(PROMPTS[3])
    expected, ids = greedy_text(hf_model, tokenizer, prompt_ids, 8)
    echoed = tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)
    s = stream()
    s.send("ensemble", [*ensemble_inputs(PROMPTS[3], 8), tensor("exclude_input_in_output", [[False]], "BOOL")])
    assert text_of(s.until_final()) == expected
    for given in ([tensor("exclude_input_in_output", [[False]], "BOOL")], []):
        whole_inputs = [*ensemble_inputs(PROMPTS[3], 8)[:2], tensor("stream", [[False]], "BOOL"), *given]
        s.send("ensemble", whole_inputs)
        (whole,) = s.until_final()
        assert text_of([whole]) == echoed
        assert whole.as_numpy("output_ids").tolist() == [prompt_ids + ids]


@pytest.mark.parametrize("streaming", [False, True])
def test_ensemble_takes_tensorrtllm_backends_logits_and_renamed_inputs(stream, tokenizer, hf_model, streaming):
    """context_logits, generation_logits and cum_log_probs through the ensemble when asked for (TensorRT-LLM's
    names), and seed / min_tokens, the newer names of random_seed / min_length."""
    ids = tokenizer.encode(PROMPTS[0])
    ref = hf_model.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=6,
        min_new_tokens=6,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    expected = ref.sequences[0, len(ids) :].tolist()
    context = hf_model(torch.tensor([ids])).logits[0]
    extra = [
        tensor("return_context_logits", [[True]], "BOOL"),
        tensor("return_generation_logits", [[True]], "BOOL"),
        tensor("return_log_probs", [[True]], "BOOL"),
        tensor("min_tokens", [[6]], "INT32"),
        tensor("seed", [[7]], "UINT64"),
    ]
    s = stream()
    s.send("ensemble", [*ensemble_inputs(PROMPTS[0], 6, streaming), *extra])
    results = s.until_final()
    assert [t for r in results for t in r.as_numpy("output_ids").reshape(-1).tolist()] == expected
    # in the last response, where TensorRT-LLM's clients read them
    assert [r.as_numpy("context_logits") is not None for r in results] == [False] * (len(results) - 1) + [True]
    np.testing.assert_allclose(results[-1].as_numpy("context_logits")[0], context.detach().numpy(), atol=1e-4)
    generation = np.concatenate([r.as_numpy("generation_logits")[0, 0] for r in results])
    np.testing.assert_allclose(generation, torch.cat(ref.logits).numpy(), atol=1e-4)
    logprobs = torch.log_softmax(torch.cat(ref.logits), -1)[torch.arange(6), torch.tensor(expected)]
    assert np.isclose(results[-1].as_numpy("cum_log_probs").item(), logprobs.sum().item(), atol=1e-3)
    s.send("ensemble", ensemble_inputs(PROMPTS[0], 6, streaming))  # asked for nothing: none of them comes
    plain = s.until_final()
    assert all(r.as_numpy("context_logits") is None and r.as_numpy("cum_log_probs") is None for r in plain)
    s.send(
        "ensemble",
        [*ensemble_inputs(PROMPTS[0], 6), tensor("seed", [[1]], "UINT64"), tensor("random_seed", [[1]], "UINT64")],
    )
    with pytest.raises(InferenceServerException, match="seed or random_seed"):
        s.next()
