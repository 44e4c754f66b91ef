"""The scalars of an llm response packed into one tensor, `response_status`, for the ensemble's hop to postprocessing.

Every tensor of a response costs each hop (the llm's stub, tritonserver, the ensemble, postprocessing's stub)
an allocation, a copy and a lookup by name, and the hop runs once per streamed token of every sequence. So the
ensemble maps this one INT64 row instead of nine tensors; a client calling `llm` directly still gets the named
ones. Layout: [finish reason code, the FIELDS in order, then sequence_length of each beam].
"""

from __future__ import annotations

import numpy as np

NAME = "response_status"
# (name, dtype) of the named outputs it carries, in order after the finish reason code
FIELDS = (
    ("num_input_tokens", np.int32),
    ("num_output_tokens", np.int32),
    ("batch_size", np.int32),
    ("queue_wait_us", np.int64),
    ("sequence_index", np.int32),
    ("stop_token", np.int32),
    ("end_id", np.int32),  # the request's end token (-1: none): the text leaves it out where it ended a generation
    ("skip_special_tokens", np.bool_),
    ("accepted_prediction_tokens", np.int32),
    ("rejected_prediction_tokens", np.int32),
)
# code 0: not finished yet; then the values of tritonllm.engine.state.sequence.FinishReason (not imported here, as that
# would load torch into postprocessing)
REASONS = (b"", b"end_id", b"length", b"stop_words", b"timeout", b"cancelled", b"error")


def pack(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """[1, 1 + len(FIELDS) + beams] from a response's named arrays."""
    reason = REASONS.index(arrays["finish_reason"].reshape(-1)[0])
    fields = [int(arrays[name].reshape(-1)[0]) for name, _ in FIELDS]
    lengths = arrays["sequence_length"].reshape(-1).tolist()
    return np.array([[reason, *fields, *lengths]], dtype=np.int64)


def unpack(status: np.ndarray) -> dict[str, np.ndarray]:
    """The named arrays again, with the shapes and types of the llm's own outputs."""
    row = status.reshape(-1).tolist()
    arrays = {"finish_reason": np.array([[REASONS[row[0]]]], dtype=np.object_)}
    for (name, dtype), value in zip(FIELDS, row[1 : 1 + len(FIELDS)], strict=True):
        arrays[name] = np.array([[value]], dtype=dtype)
    arrays["sequence_length"] = np.array([row[1 + len(FIELDS) :]], dtype=np.int32)
    return arrays
