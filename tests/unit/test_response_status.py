"""The llm's per-response scalars survive the trip through response_status with their values, types and shapes."""

from __future__ import annotations

import numpy as np

from tritonllm.engine.state.sequence import FinishReason
from tritonllm.wire import response_status


def named(reason: bytes, lengths: list[int]) -> dict[str, np.ndarray]:
    return {
        "finish_reason": np.array([[reason]], dtype=np.object_),
        "num_input_tokens": np.array([[64]], dtype=np.int32),
        "num_output_tokens": np.array([[17]], dtype=np.int32),
        "batch_size": np.array([[32]], dtype=np.int32),
        "queue_wait_us": np.array([[2**40]], dtype=np.int64),
        "sequence_index": np.array([[3]], dtype=np.int32),
        "stop_token": np.array([[-1]], dtype=np.int32),
        "end_id": np.array([[2]], dtype=np.int32),
        "skip_special_tokens": np.array([[False]]),
        "accepted_prediction_tokens": np.array([[12]], dtype=np.int32),
        "rejected_prediction_tokens": np.array([[5]], dtype=np.int32),
        "sequence_length": np.array([lengths], dtype=np.int32),
        "output_ids": np.zeros((1, len(lengths), 5), dtype=np.int32),  # not carried
    }


def test_every_finish_reason_has_a_code():
    assert set(response_status.REASONS[1:]) == {r.value.encode() for r in FinishReason}


def test_pack_then_unpack_gives_the_named_outputs_back():
    for reason in response_status.REASONS:
        for lengths in ([1], [4, 2, 0]):
            arrays = named(reason, lengths)
            status = response_status.pack(arrays)
            assert status.dtype == np.int64 and status.shape == (1, 1 + len(response_status.FIELDS) + len(lengths))
            back = response_status.unpack(status)
            assert set(back) == set(arrays) - {"output_ids"}
            for name, value in back.items():
                assert value.dtype == arrays[name].dtype and value.shape == arrays[name].shape, name
                assert np.array_equal(value, arrays[name]), name
