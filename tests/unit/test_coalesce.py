"""Merging queued streamed responses: the merged one says what the parts said, and FINAL still comes last."""

from __future__ import annotations

import numpy as np

from tritonllm.backend.coalesce import PendingResponse, coalesce, merge


def token_response(tokens: list[int], done: int, reason: bytes = b"", first: bool = False) -> dict:
    n = len(tokens)
    arrays = {
        "output_ids": np.array(tokens, dtype=np.int32).reshape(1, 1, n),
        "sequence_length": np.array([[n]], dtype=np.int32),
        "preceding_ids": np.array([[100 + done - n]], dtype=np.int32),
        "finish_reason": np.array([[reason]], dtype=np.object_),
        "num_output_tokens": np.array([[done]], dtype=np.int32),
        "output_log_probs": -np.arange(done - n, done, dtype=np.float32).reshape(1, 1, n),
        "top_log_prob_ids": np.arange(2 * (done - n), 2 * done, dtype=np.int32).reshape(1, 1, n, 2),
        "cum_log_probs": np.array([[-float(done)]], dtype=np.float32),
    }
    if first:
        arrays["context_logits"] = np.ones((1, 3, 5), dtype=np.float32)
    return arrays


def test_merge_equals_one_response_with_all_the_tokens():
    merged = merge(merge(token_response([7], 1, first=True), token_response([8], 2)), token_response([9], 3, b"length"))
    whole = token_response([7, 8, 9], 3, b"length", first=True)
    assert merged.keys() == whole.keys()
    for name in whole:
        np.testing.assert_array_equal(merged[name], whole[name], err_msg=name)


def test_coalesce_merges_per_stream_and_sends_final_last():
    a, b = object(), object()
    everything = frozenset({"output_ids", "sequence_length"})
    pending = [
        PendingResponse(a, token_response([1], 1), False, everything, (a, 0)),
        PendingResponse(a, token_response([2], 1), False, everything, (a, 1)),  # another sample of the same request
        PendingResponse(b, {"output_ids": np.zeros((1, 2, 4))}, True, everything),  # beams: never merged
        PendingResponse(a, token_response([3], 2, b"end_id"), False, everything, (a, 0)),
        PendingResponse(a, token_response([4], 2, b"length"), True, everything, (a, 1)),
    ]
    sent = coalesce(pending)
    assert [r.arrays["output_ids"].shape for r in sent] == [(1, 2, 4), (1, 1, 2), (1, 1, 2)]
    assert sent[1].arrays["output_ids"].reshape(-1).tolist() == [1, 3] and not sent[1].final
    assert sent[2].arrays["output_ids"].reshape(-1).tolist() == [2, 4] and sent[2].final
    assert coalesce(pending[:1]) == pending[:1]
