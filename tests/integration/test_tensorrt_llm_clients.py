"""What tensorrtllm_backend's own clients send, as their CI runs them, against the real tritonserver: the tensors,
shapes, dtypes and defaults of `inflight_batcher_llm_client.py` (tensorrt_llm), `end_to_end_grpc_client.py`
(the ensemble over a gRPC stream), `end_to_end_test.py` (preprocessing -> tensorrt_llm -> postprocessing by
hand, then the ensemble, unary) and `benchmark_core_model.py` (tensorrt_llm, unary), held to TensorRT-LLM's
rules and to transformers' greedy output. The scripts themselves live outside this repository (docs/tensors.md
has the table of their runs)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import launch_triton
from oracles import greedy_ids
from triton_helpers import tensor
from tritonclient.utils import InferenceServerException

PROMPT = "Born in north-east France, Soyer trained as a"


def ifb_client_inputs(ids: list[int], output_len: int, streaming: bool, end_id: int, pad_id: int) -> list:
    """inflight_batcher_llm_client.py's tensors with its defaults (beam 1, temperature 1.0, top_k 1, top_p 0)."""
    return [
        tensor("input_ids", [ids], "INT32"),
        tensor("input_lengths", [[len(ids)]], "INT32"),
        tensor("request_output_len", [[output_len]], "INT32"),
        tensor("beam_width", [[1]], "INT32"),
        tensor("temperature", [[1.0]], "FP32"),
        tensor("streaming", [[streaming]], "BOOL"),
        tensor("end_id", [[end_id]], "INT32"),
        tensor("pad_id", [[pad_id]], "INT32"),
        tensor("runtime_top_k", [[1]], "INT32"),
        tensor("runtime_top_p", [[0.0]], "FP32"),
    ]


def e2e_grpc_client_arrays(prompt: str, output_len: int, streaming: bool, exclude_input: bool = False) -> dict:
    """end_to_end_grpc_client.py's tensors with its defaults (temperature 1.0, exclude_input_in_output false)."""
    return {
        "text_input": (np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
        "max_tokens": (np.array([[output_len]], dtype=np.int32), "INT32"),
        "stream": (np.array([[streaming]]), "BOOL"),
        "beam_width": (np.array([[1]], dtype=np.int32), "INT32"),
        "temperature": (np.array([[1.0]], dtype=np.float32), "FP32"),
        "exclude_input_in_output": (np.array([[exclude_input]]), "BOOL"),
    }


def e2e_grpc_client_inputs(prompt: str, output_len: int, streaming: bool, exclude_input: bool = False) -> list:
    arrays = e2e_grpc_client_arrays(prompt, output_len, streaming, exclude_input)
    return [tensor(name, array, datatype) for name, (array, datatype) in arrays.items()]


def read_stream(client: grpcclient.InferenceServerClient, model: str, inputs: list, outputs=None) -> list:
    """Every response of one request on a gRPC stream up to its FINAL flag, as the clients read them."""
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error or result))
    client.async_stream_infer(model, inputs, outputs=outputs, enable_empty_final_response=True)
    responses = []
    try:
        while True:
            result = got.get(timeout=120)
            if isinstance(result, Exception):
                raise result
            if result.get_response().outputs:
                responses.append(result)
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return responses
    finally:
        client.stop_stream()


@pytest.fixture(scope="module")
def greedy(hf_model, tokenizer):
    prompt_ids = tokenizer.encode(PROMPT)
    return prompt_ids, greedy_ids(hf_model, prompt_ids, 12)


# --- the default, decoupled deployment: streaming clients --------------------------------------------------


def test_inflight_batcher_client_streams_greedy_ids_from_tensorrt_llm(triton, greedy):
    prompt_ids, expected = greedy
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        responses = read_stream(client, "tensorrt_llm", ifb_client_inputs(prompt_ids, 12, True, -1, 0))
    streamed = [t for r in responses for t in r.as_numpy("output_ids")[0][0].tolist()]
    assert streamed == expected  # temperature 1.0 with top_k 1 and top_p 0 is greedy; no prompt when streamed
    assert all(r.as_numpy("sequence_length")[0][0] == r.as_numpy("output_ids").shape[2] for r in responses)


def test_the_end_token_is_neither_returned_nor_counted(triton, greedy):
    prompt_ids, expected = greedy
    end_id = expected[4]
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        responses = read_stream(client, "tensorrt_llm", ifb_client_inputs(prompt_ids, 12, True, end_id, 0))
    streamed = [t for r in responses for t in r.as_numpy("output_ids")[0][0].tolist()]
    assert streamed == expected[: expected.index(end_id)]


def test_a_batch_in_one_request_answers_each_row_with_its_batch_index(triton, greedy, hf_model):
    prompt_ids, expected = greedy
    other = prompt_ids[:5]
    padded = [prompt_ids, other + [0] * (len(prompt_ids) - len(other))]
    inputs = [
        tensor("input_ids", padded, "INT32"),
        tensor("input_lengths", [[len(prompt_ids)], [len(other)]], "INT32"),
        tensor("request_output_len", [[12], [12]], "INT32"),
        tensor("streaming", [[True], [True]], "BOOL"),
    ]
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        responses = read_stream(client, "tensorrt_llm", inputs)
    rows: dict[int, list[int]] = {0: [], 1: []}
    for r in responses:
        rows[int(r.as_numpy("batch_index")[0][0])] += r.as_numpy("output_ids")[0][0].tolist()
    assert rows == {0: expected, 1: greedy_ids(hf_model, other, 12)}


def test_streamed_context_logits_come_in_the_last_response(triton, greedy):
    prompt_ids, _ = greedy
    inputs = [*ifb_client_inputs(prompt_ids, 4, True, -1, 0), tensor("return_context_logits", [[True]], "BOOL")]
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        responses = read_stream(client, "tensorrt_llm", inputs)
    assert [r.as_numpy("context_logits") is not None for r in responses] == [False] * (len(responses) - 1) + [True]
    assert responses[-1].as_numpy("context_logits").shape[1] == len(prompt_ids)


def test_end_to_end_grpc_client_reads_text_output_beams_and_gets_greedy_text(triton, greedy, tokenizer):
    prompt_ids, expected = greedy
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        streamed = read_stream(client, "ensemble", e2e_grpc_client_inputs(PROMPT, 12, True))
        whole = read_stream(client, "ensemble", e2e_grpc_client_inputs(PROMPT, 12, False))
    assert all(r.as_numpy("text_output").shape == (1,) for r in streamed)  # [beams]: output[0].decode()
    text = tokenizer.decode(expected, skip_special_tokens=True)
    assert "".join(r.as_numpy("text_output")[0].decode() for r in streamed) == text
    # not streamed and exclude_input_in_output false: the prompt, then the output
    (answer,) = whole
    assert answer.as_numpy("text_output")[0].decode() == tokenizer.decode(
        prompt_ids + expected, skip_special_tokens=True
    )


@pytest.mark.parametrize("streaming", [True, False])
def test_end_to_end_grpc_client_with_an_end_id_gets_the_text_before_it(triton, greedy, tokenizer, streaming):
    """end_to_end_grpc_client.py --end-id: TensorRT-LLM's text leaves out the end token that ended it, whatever token
    it is (here one the greedy text holds, not a special one that decoding would skip anyway)."""
    prompt_ids, expected = greedy
    end_id = expected[4]
    inputs = [*e2e_grpc_client_inputs(PROMPT, 12, streaming, exclude_input=True), tensor("end_id", [[end_id]], "INT32")]
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        responses = read_stream(client, "ensemble", inputs)
    text = "".join(r.as_numpy("text_output")[0].decode() for r in responses)
    assert text == tokenizer.decode(expected[: expected.index(end_id)], skip_special_tokens=True)
    assert responses[-1].as_numpy("finish_reason").reshape(-1)[0] == b"end_id"


def test_end_to_end_grpc_clients_batch_inputs_answer_each_prompt_with_its_batch_index(triton, hf_model, tokenizer):
    """--batch-inputs: its single-prompt tensors stacked along the batch dimension into one request."""
    prompts = [PROMPT, "The quick brown fox"]
    rows = [e2e_grpc_client_arrays(p, 8, True) for p in prompts]
    batched = [
        tensor(name, np.concatenate([row[name][0] for row in rows]), datatype)
        for name, (_, datatype) in rows[0].items()
    ]
    outputs = [grpcclient.InferRequestedOutput(n) for n in ("text_output", "batch_index")]
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        responses = read_stream(client, "ensemble", batched, outputs)
    texts = {0: "", 1: ""}
    for r in responses:
        texts[int(r.as_numpy("batch_index")[0][0])] += r.as_numpy("text_output")[0].decode()
    expected = [
        tokenizer.decode(greedy_ids(hf_model, tokenizer.encode(p), 8), skip_special_tokens=True) for p in prompts
    ]
    assert [texts[0], texts[1]] == expected


def test_perf_metrics_arrive_in_every_response(triton, greedy):
    prompt_ids, _ = greedy
    inputs = [*ifb_client_inputs(prompt_ids, 4, True, -1, 0), tensor("return_perf_metrics", [[True]], "BOOL")]
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        responses = read_stream(client, "tensorrt_llm", inputs)
    last = responses[-1]
    blocks = (len(prompt_ids) + 4 + 15) // 16
    assert last.as_numpy("kv_cache_alloc_new_blocks")[0][0] + last.as_numpy("kv_cache_reused_blocks")[0][0] >= blocks
    arrival, first = last.as_numpy("arrival_time_ns")[0][0], last.as_numpy("first_token_time_ns")[0][0]
    assert 0 < arrival <= first <= last.as_numpy("last_token_time_ns")[0][0]
    assert all(r.as_numpy("first_scheduled_time_ns") is not None for r in responses)


def test_a_stop_request_ends_a_generation_as_inflight_batcher_clients_stop_after_ms_sends_it(triton):
    """--stop-after-ms: input_ids, input_lengths, request_output_len 0 and stop true, under the generation's id."""
    got: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        client.start_stream(callback=lambda result, error: got.put(error or result))
        client.async_stream_infer("tensorrt_llm", ifb_client_inputs([5, 6, 7], 1900, True, -1, 0), request_id="long")
        got.get(timeout=60)  # it runs
        stop = [
            tensor("input_ids", [[0]], "INT32"),
            tensor("input_lengths", [[0]], "INT32"),
            tensor("request_output_len", [[0]], "INT32"),
            tensor("stop", [[True]], "BOOL"),
        ]
        client.async_stream_infer("tensorrt_llm", stop, request_id="long")
        tokens, cancelled, stop_answered = 0, False, False
        while not (cancelled and stop_answered):
            result = got.get(timeout=60)
            assert not isinstance(result, Exception), result
            if result.as_numpy("output_ids") is None:  # the client prints "Got cancellation response from server"
                stop_answered = True
            elif result.as_numpy("finish_reason") is not None and result.as_numpy("finish_reason")[0][0]:
                assert result.as_numpy("finish_reason")[0][0] == b"cancelled"
                cancelled = True
            else:
                tokens += result.as_numpy("output_ids").size
        client.stop_stream()
    assert tokens < 1900


def test_many_short_relayed_generations_at_once_leave_the_server_up(triton):
    """The relay's cancellation watcher asks each client's sender whether it went away; asked after the FINAL
    response it crashed tritonserver (TRITONBACKEND_ResponseFactoryIsCancelled on a freed factory)."""

    def client_of(i: int) -> list:
        got: queue.Queue = queue.Queue()
        answers = []
        with grpcclient.InferenceServerClient(triton.grpc_url) as client:
            client.start_stream(callback=lambda result, error: got.put(error or result))
            for j in range(10):
                inputs = [
                    tensor("input_ids", [[5 + i, 6, 7]], "INT32"),
                    tensor("request_output_len", [[1 + j % 3]], "INT32"),
                    tensor("streaming", [[True]], "BOOL"),
                ]
                client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
                while True:
                    result = got.get(timeout=60)
                    assert not isinstance(result, Exception), result
                    final = result.get_response().parameters.get("triton_final_response")
                    if final is not None and final.bool_param:
                        answers.append(j)
                        break
            client.stop_stream()
        return answers

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(client_of, range(8))) == [list(range(10))] * 8
    assert triton.process.poll() is None


def test_unary_infer_answers_501_in_the_decoupled_deployment(triton):
    body = {"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [PROMPT]}]}
    request = urllib.request.Request(f"{triton.http_url}/v2/models/ensemble/infer", json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 501  # Triton's own answer: the deployment chooses (serve --decoupled-mode false)


# --- serve --decoupled-mode false: unary clients ---------------------------------------------------------


@pytest.fixture(scope="module")
def unary_triton(tiny_model_dir, tmp_path_factory):
    server = launch_triton(tiny_model_dir, tmp_path_factory.mktemp("unary-triton"), decoupled=False)
    yield server
    server.stop()


def test_a_plain_kserve_infer_on_the_ensemble_answers(unary_triton, greedy, tokenizer):
    prompt_ids, expected = greedy
    body = {
        "inputs": [
            {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [PROMPT]},
            {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [12]},
        ]
    }
    request = urllib.request.Request(f"{unary_triton.http_url}/v2/models/ensemble/infer", json.dumps(body).encode())
    outputs = {o["name"]: o for o in json.loads(urllib.request.urlopen(request, timeout=120).read())["outputs"]}
    # no exclude_input_in_output: the model's parameter, false as in TensorRT-LLM: the prompt, then the output
    assert outputs["text_output"]["data"] == [tokenizer.decode(prompt_ids + expected, skip_special_tokens=True)]


def test_benchmark_core_model_unary_infer_on_tensorrt_llm_echoes_the_prompt(unary_triton, greedy):
    prompt_ids, expected = greedy
    inputs = [
        httpclient.InferInput("input_ids", [1, len(prompt_ids)], "INT32"),
        httpclient.InferInput("input_lengths", [1, 1], "INT32"),
        httpclient.InferInput("request_output_len", [1, 1], "INT32"),
    ]
    for t, value in zip(inputs, ([prompt_ids], [[len(prompt_ids)]], [[12]]), strict=True):
        t.set_data_from_numpy(np.array(value, dtype=np.int32))
    with httpclient.InferenceServerClient(unary_triton.http_url.removeprefix("http://")) as http:
        result = http.infer("tensorrt_llm", inputs, request_id="0")
    assert result.as_numpy("output_ids").tolist() == [[prompt_ids + expected]]
    assert result.as_numpy("sequence_length").tolist() == [[len(prompt_ids) + 12]]
    with grpcclient.InferenceServerClient(unary_triton.grpc_url) as client:
        excluded = client.infer(
            "tensorrt_llm",
            [*ifb_client_inputs(prompt_ids, 12, False, -1, 0), tensor("exclude_input_in_output", [[True]], "BOOL")],
        )
    assert excluded.as_numpy("output_ids").tolist() == [[expected]]


def test_end_to_end_test_chain_by_hand_equals_the_ensemble(unary_triton, tokenizer):
    """end_to_end_test.py: preprocessing, tensorrt_llm and postprocessing under tensorrtllm_backend's names."""
    with httpclient.InferenceServerClient(unary_triton.http_url.removeprefix("http://")) as http:

        def infer(model: str, tensors: dict) -> httpclient.InferResult:
            inputs = []
            for name, array in tensors.items():
                dtype = "BYTES" if array.dtype == np.object_ else {"int32": "INT32", "bool": "BOOL"}[str(array.dtype)]
                inputs.append(httpclient.InferInput(name, list(array.shape), dtype))
                inputs[-1].set_data_from_numpy(array)
            return http.infer(model, inputs)

        words = np.array([[""]], dtype=np.object_)
        query = {"QUERY": np.array([[PROMPT]], dtype=np.object_), "BAD_WORDS_DICT": words, "STOP_WORDS_DICT": words}
        pre = infer("preprocessing", {**query, "REQUEST_OUTPUT_LEN": np.array([[10]], dtype=np.int32)})
        llm = infer(
            "tensorrt_llm",
            {
                "input_ids": pre.as_numpy("INPUT_ID"),
                "decoder_input_ids": pre.as_numpy("DECODER_INPUT_ID"),
                "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
                "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
                "end_id": pre.as_numpy("OUT_END_ID"),
                "pad_id": pre.as_numpy("OUT_PAD_ID"),
            },
        )
        post = infer(
            "postprocessing",
            {"TOKENS_BATCH": llm.as_numpy("output_ids"), "SEQUENCE_LENGTH": llm.as_numpy("sequence_length")},
        )
        ensemble = infer(
            "ensemble",
            {
                "text_input": np.array([[PROMPT]], dtype=np.object_),
                "max_tokens": np.array([[10]], dtype=np.int32),
                "bad_words": words,
                "stop_words": words,
            },
        )
    assert pre.as_numpy("INPUT_ID").tolist() == [tokenizer.encode(PROMPT)]
    assert post.as_numpy("OUTPUT").tolist() == ensemble.as_numpy("text_output").tolist()


def test_streaming_is_refused_with_tensorrt_llms_message(unary_triton):
    with grpcclient.InferenceServerClient(unary_triton.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="only supported if model is deployed using decoupled"):
            client.infer("ensemble", e2e_grpc_client_inputs(PROMPT, 4, True))


def test_perf_analyzer_without_streaming_against_the_ensemble_and_tensorrt_llm(unary_triton, tmp_path):
    data = tmp_path / "in.json"
    data.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "text_input": [PROMPT],
                        "max_tokens": [8],
                        "input_ids": {"content": [5, 6, 7, 8], "shape": [4]},
                        "input_lengths": [4],
                        "request_output_len": [8],
                    }
                ]
            }
        )
    )
    for model, fields in (
        ("ensemble", ("text_input", "max_tokens")),
        ("tensorrt_llm", ("input_ids", "input_lengths", "request_output_len")),
    ):
        entry = {k: v for k, v in json.loads(data.read_text())["data"][0].items() if k in fields}
        (tmp_path / f"{model}.json").write_text(json.dumps({"data": [entry]}))
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "tritonllm.launcher.cli", "perf-analyzer"),
                *("-m", model, "-i", "grpc", "-u", unary_triton.grpc_url),
                *("--input-data", str(tmp_path / f"{model}.json"), "--concurrency-range", "2"),
                *("--measurement-mode", "count_windows", "--measurement-request-count", "4"),
                "--stability-percentage",
                "999",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "throughput" in proc.stdout


def test_the_engine_model_still_streams_in_the_unary_deployment(unary_triton, greedy):
    prompt_ids, expected = greedy
    with grpcclient.InferenceServerClient(unary_triton.grpc_url) as client:
        responses = read_stream(
            client,
            "llm",
            [
                tensor("input_ids", [prompt_ids], "INT32"),
                tensor("request_output_len", [[12]], "INT32"),
                tensor("streaming", [[True]], "BOOL"),
            ],
        )
    assert len(responses) > 1 and [t for r in responses for t in r.as_numpy("output_ids")[0][0]] == expected
