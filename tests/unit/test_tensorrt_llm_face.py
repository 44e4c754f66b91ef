"""TensorRT-LLM's `tensorrt_llm` face over llm, and the unary deployment (`serve --decoupled-mode false`), without
Triton: the rules of tensorrtllm_backend's inflight_batcher_llm/src (utils.cc, model_instance_state.cc)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import REPOSITORY
from tritonllm.backend.tensorrt_llm_face import (
    BATCH_NEEDS_DECOUPLED,
    STREAMING_NEEDS_DECOUPLED,
    Generation,
    generations,
    postprocessing_output,
    preprocessing_outputs,
    split_rows,
    stacked,
)
from tritonllm.launcher import decoupled_mode
from tritonllm.launcher.tritonserver import stage_repository
from tritonllm.wire import response_status
from tritonllm.wire.triton_names import TritonNames


def i32(rows) -> np.ndarray:
    return np.array(rows, dtype=np.int32)


def test_a_batch_is_one_generation_a_row_each_cut_to_its_input_length():
    inputs = {
        "input_ids": i32([[5, 6, 7, 0], [8, 9, 0, 0]]),
        "input_lengths": i32([[3], [2]]),
        "request_output_len": i32([[4], [4]]),
        "decoder_input_ids": i32([[0], [0]]),
    }
    rows = generations(inputs, exclude_input_default=False, decoupled=True)
    assert [r["input_ids"].tolist() for r in rows] == [[[5, 6, 7]], [[8, 9]]]
    assert all(r["request_output_len"].tolist() == [[4]] for r in rows)
    assert all("input_lengths" not in r and "decoder_input_ids" not in r for r in rows)
    assert [r["exclude_input_in_output"].tolist() for r in rows] == [[[False]], [[False]]]


def test_one_generation_keeps_its_input_lengths_for_the_llm_and_takes_the_models_default():
    (row,) = generations({"input_ids": i32([[5, 6]]), "input_lengths": i32([[2]])}, True, decoupled=False)
    assert row["input_lengths"].tolist() == [[2]] and row["exclude_input_in_output"].tolist() == [[True]]
    given = {"input_ids": i32([[5]]), "exclude_input_in_output": np.array([[False]])}
    assert generations(given, True, decoupled=False)[0]["exclude_input_in_output"].tolist() == [[False]]


def test_tensorrt_llms_types_become_the_llms():
    (row,) = generations(
        {
            "input_ids": i32([[5]]),
            "early_stopping": np.array([[True]]),
            "lora_weights": np.ones((1, 2, 3), dtype=np.float16),
        },
        False,
        decoupled=True,
    )
    assert row["early_stopping"].dtype == np.int32 and row["early_stopping"].tolist() == [[1]]
    assert row["lora_weights"].dtype == np.float32


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"input_ids": i32([[5]]), "streaming": np.array([[True]])}, STREAMING_NEEDS_DECOUPLED),
        ({"input_ids": i32([[5], [6]]), "input_lengths": i32([[1], [1]])}, BATCH_NEEDS_DECOUPLED),
        ({"input_ids": i32([[5]]), "num_return_sequences": i32([[2]])}, "needs decoupled mode"),
    ],
)
def test_a_unary_deployment_refuses_what_answers_more_than_once(inputs, message):
    with pytest.raises(ValueError, match=message):
        generations(inputs, False, decoupled=False)


def test_a_batch_needs_each_rows_length():
    with pytest.raises(ValueError, match="input_lengths"):
        generations({"input_ids": i32([[5], [6]])}, False, decoupled=True)
    with pytest.raises(ValueError, match=r"input_lengths\[1\]"):
        generations({"input_ids": i32([[5, 6], [6, 7]]), "input_lengths": i32([[2], [3]])}, False, decoupled=True)


def llm_response(ids, reason=b"", **extra) -> dict[str, np.ndarray]:
    arrays = {
        "output_ids": i32([[ids]]),
        "sequence_length": i32([[len(ids)]]),
        "finish_reason": np.array([[reason]], dtype=np.object_),
        **extra,
    }
    return arrays


WANTED = frozenset({"output_ids", "sequence_length", "output_log_probs", "context_logits", "response_status"})


def test_the_end_token_is_neither_returned_nor_counted():
    generation = Generation(WANTED, end_id=2, batch_index=None, samples=1)
    logprobs = np.array([[[-0.1, -0.2, -0.3]]], dtype=np.float32)
    answer = generation.response(llm_response([7, 8, 2], b"end_id", output_log_probs=logprobs))
    assert answer["output_ids"].tolist() == [[[7, 8]]] and answer["sequence_length"].tolist() == [[2]]
    assert answer["output_log_probs"].tolist() == [[[pytest.approx(-0.1), pytest.approx(-0.2)]]]
    assert generation.done
    kept = Generation(WANTED, end_id=2, batch_index=None, samples=1).response(llm_response([7, 2], b"length"))
    assert kept["output_ids"].tolist() == [[[7, 2]]]  # it ended on its length: the 2 is an ordinary token


def test_dropping_the_end_token_repacks_the_status_postprocessing_reads():
    status = {
        "finish_reason": np.array([[b"end_id"]], dtype=np.object_),
        "sequence_length": i32([[3]]),
        **{name: np.zeros((1, 1), dtype=dtype) for name, dtype in response_status.FIELDS},
    }
    arrays = llm_response([7, 8, 2], b"end_id", response_status=response_status.pack(status))
    answer = Generation(WANTED, end_id=2, batch_index=None, samples=1).response(arrays)
    assert response_status.unpack(answer["response_status"])["sequence_length"].tolist() == [[2]]


def test_beams_that_ended_on_the_end_token_are_padded_with_minus_one_as_tensorrt_llm_pads():
    arrays = {
        "output_ids": i32([[[7, 8, 2], [7, 2, 0]]]),  # the second beam padded after its end token
        "sequence_length": i32([[3, 2]]),
        "finish_reason": np.array([[b"end_id"]], dtype=np.object_),
    }
    answer = Generation(WANTED, end_id=2, batch_index=None, samples=1).response(arrays)
    assert answer["output_ids"].tolist() == [[[7, 8], [7, -1]]] and answer["sequence_length"].tolist() == [[2, 1]]


def test_only_wanted_outputs_go_back_with_the_batch_index_of_a_batched_request():
    answer = Generation(frozenset({"output_ids"}), None, batch_index=1, samples=2).response(
        llm_response([7], b"length")
    )
    assert set(answer) == {"output_ids", "batch_index"} and answer["batch_index"].tolist() == [[1]]


def test_preprocessing_answers_tensorrt_llms_names_when_asked():
    ours = {
        "input_ids": i32([[5, 6, 7]]),
        "input_lengths": i32([[3]]),
        "pad_id": i32([[2]]),
        "end_id": i32([[2]]),
        "request_output_len": i32([[9]]),
    }
    theirs = preprocessing_outputs(
        ours, {"INPUT_ID", "REQUEST_INPUT_LEN", "DECODER_INPUT_ID", "OUT_END_ID", "REQUEST_OUTPUT_LEN", "input_ids"}
    )
    assert set(theirs) == {"INPUT_ID", "REQUEST_INPUT_LEN", "DECODER_INPUT_ID", "OUT_END_ID", "REQUEST_OUTPUT_LEN"}
    assert theirs["REQUEST_INPUT_LEN"].tolist() == [[3]] and theirs["DECODER_INPUT_ID"].tolist() == [[2]]
    assert theirs["REQUEST_OUTPUT_LEN"].tolist() == [[9]]


def test_postprocessing_decodes_each_beam_up_to_its_length():
    text = postprocessing_output(lambda ids: ",".join(map(str, ids)), i32([[[5, 6, 7], [5, 8, -1]]]), i32([[3, 2]]))
    assert text.tolist() == [b"5,6,7", b"5,8"]


def test_the_unary_deployment_puts_the_face_in_the_ensemble_and_drops_its_decoupling():
    face = (REPOSITORY / "tensorrt_llm" / "config.pbtxt").read_text()
    ensemble = (REPOSITORY / "ensemble" / "config.pbtxt").read_text()
    assert "decoupled: false" in decoupled_mode.unary_face(face)
    unary = decoupled_mode.unary_ensemble(ensemble, TritonNames())
    assert 'model_name: "tensorrt_llm"' in unary and 'model_name: "llm"' not in unary
    assert '{ name: "early_stopping" data_type: TYPE_BOOL' in unary
    assert '{ name: "lora_weights" data_type: TYPE_FP16' in unary


def test_a_staged_unary_repository_links_all_but_the_two_configs_it_changes():
    staged = stage_repository(REPOSITORY, 1, decoupled=False)
    try:
        assert "decoupled: false" in (staged / "tensorrt_llm" / "config.pbtxt").read_text()
        assert 'model_name: "tensorrt_llm"' in (staged / "ensemble" / "config.pbtxt").read_text()
        assert (staged / "tensorrt_llm" / "1").resolve() == REPOSITORY / "tensorrt_llm" / "1"
        assert all((staged / name).is_symlink() for name in ("llm", "preprocessing", "postprocessing"))
    finally:
        import shutil

        shutil.rmtree(staged)


def test_a_batch_of_prompts_is_split_then_stacked_padded_as_tensorrt_llm_pads():
    rows = split_rows({"text_input": np.array([[b"a"], [b"b c"]], dtype=np.object_), "max_tokens": i32([[4], [5]])})
    assert [r["max_tokens"].tolist() for r in rows] == [[[4]], [[5]]]
    prompts = [
        {
            "input_ids": i32([[5]]),
            "pad_id": i32([[2]]),
            "bad_words_list": i32([[[7], [1]]]),
            "embedding_bias": np.zeros((1, 0), dtype=np.float32),
            "prediction_ids": np.zeros((1, 0), dtype=np.int32),
        },
        {
            "input_ids": i32([[5, 6, 7]]),
            "pad_id": i32([[3]]),
            "bad_words_list": i32([[[7, 8], [1, 2]]]),
            "embedding_bias": np.ones((1, 4), dtype=np.float32),
            "prediction_ids": np.zeros((1, 0), dtype=np.int32),
        },
    ]
    batch = stacked(prompts)
    assert batch["input_ids"].tolist() == [[5, 2, 2], [5, 6, 7]]
    assert batch["bad_words_list"].tolist() == [[[7, -1], [1, -1]], [[7, 8], [1, 2]]]
    assert batch["embedding_bias"].tolist() == [[0.0] * 4, [1.0] * 4]
    prompts[1]["prediction_ids"] = i32([[9]])
    with pytest.raises(ValueError, match="one prompt a request"):
        stacked(prompts)


def test_serve_refuses_a_shim_through_a_unary_ensemble(tiny_model_dir, capfd):
    from tritonllm.launcher import cli

    argv = ["serve", "--model-dir", str(tiny_model_dir), "--decoupled-mode", "false", "--through-ensemble"]
    assert cli.main(argv) == 2
    assert "--through-ensemble" in capfd.readouterr().err
