"""The llm's multiplexed rows: packed by the llm, unpacked by the shim into what the llm's own responses hold."""

from __future__ import annotations

import numpy as np

from tritonllm.tokenizer.postprocess import postprocess
from tritonllm.wire import multiplex, response_status


def _response(new: list[int], preceding: list[int], index: int, reason: bytes = b"") -> dict[str, np.ndarray]:
    """The arrays a Responder makes for one plain streamed response."""
    return {
        "output_ids": np.array(new, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(new)]], dtype=np.int32),
        "preceding_ids": np.array(preceding, dtype=np.int32).reshape(1, -1),
        "finish_reason": np.array([[reason]], dtype=np.object_),
        "num_input_tokens": np.array([[7]], dtype=np.int32),
        "num_output_tokens": np.array([[len(new) + 3]], dtype=np.int32),
        "batch_size": np.array([[2]], dtype=np.int32),
        "queue_wait_us": np.array([[1234]], dtype=np.int64),
        "sequence_index": np.array([[index]], dtype=np.int32),
        "stop_token": np.array([[-1]], dtype=np.int32),
        "end_id": np.array([[2]], dtype=np.int32),
        "skip_special_tokens": np.array([[True]]),
        "accepted_prediction_tokens": np.array([[0]], dtype=np.int32),
        "rejected_prediction_tokens": np.array([[0]], dtype=np.int32),
    }


class Letters:
    """A tokenizer whose token i is the letter chr(97 + i)."""

    def __len__(self) -> int:
        return 26

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(chr(97 + int(i)) for i in ids)


def test_rows_unpack_to_what_the_llms_own_responses_postprocess_to():
    responses = [
        ("req-a", _response([1, 2], [0], 0), False),
        ("req-b", _response([], [5, 6, 7], 1, b"length"), True),  # a final response may hold no token
        ("req-a", _response([3], [], 0, b"end_id"), True),
    ]
    packed = multiplex.pack([multiplex.Row(rid, arrays, final) for rid, arrays, final in responses])
    assert set(packed) == set(multiplex.ROW_OUTPUTS)
    assert all(a.shape[0] == 1 for a in packed.values())  # the batch dimension

    rows = multiplex.unpack(packed)
    assert [(r.request_id, r.final) for r in rows] == [(rid, final) for rid, _, final in responses]
    for row, (_, arrays, _) in zip(rows, responses, strict=True):
        own = {**arrays, response_status.NAME: response_status.pack(arrays)}
        assert postprocess(Letters(), row.arrays).keys() == postprocess(Letters(), own).keys()
        for name, value in postprocess(Letters(), own).items():
            np.testing.assert_array_equal(postprocess(Letters(), row.arrays)[name], value, err_msg=name)
    assert postprocess(Letters(), rows[0].arrays)["text_output"].tolist() == [b"bc"]
