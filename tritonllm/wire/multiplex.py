"""Many generations' responses in one: the llm's multiplexed stream, for a client that runs many at once (the shim).

Each streamed response costs the llm's stub a send, tritonserver a response to route and the client a gRPC message
to parse, whatever it holds: with 32 streams decoding, 32 of each per engine step, on the cores the step runs on
(bench/serving_cost.py). A client may therefore open a channel (a request to `llm` with `mux_open`, which stays
open and answers at once with an empty response), and name it in its generations (`mux_channel`, the opening
request's id). The responses that the llm's sender has queued for those generations then go out as one response on
the channel, a row each, tagged with the generation's request id; each generation's own request gets only its
empty FINAL response (or its error). Rows hold what a response without log-probs, logits or beams holds; a
generation that asks for more, or reaches an llm instance that does not hold the channel, is answered on its own
request as always, so a client reads both.

Layout of a channel response, n rows: `mux_request_ids` [n] (BYTES), `mux_final` [n] (the generation's last row),
`mux_status` [n, width] (response_status's row of each), `mux_token_counts` [n] with `mux_output_ids` [sum],
`mux_preceding_counts` [n] with `mux_preceding_ids` [sum], each with the batch dimension in front.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tritonllm.wire import response_status

OPEN = "mux_open"
CHANNEL = "mux_channel"
ROW_OUTPUTS = (
    "mux_request_ids",
    "mux_final",
    "mux_status",
    "mux_token_counts",
    "mux_output_ids",
    "mux_preceding_counts",
    "mux_preceding_ids",
)


@dataclass
class Row:
    request_id: str
    arrays: dict[str, np.ndarray]  # the llm's named outputs of one response (one beam)
    final: bool  # the generation's last response


def pack(rows: list[Row]) -> dict[str, np.ndarray]:
    """One channel response's outputs from the rows it carries."""
    new = [r.arrays["output_ids"].reshape(-1) for r in rows]
    preceding = [r.arrays["preceding_ids"].reshape(-1) for r in rows]
    return {
        "mux_request_ids": np.array([[r.request_id.encode() for r in rows]], dtype=np.object_),
        "mux_final": np.array([[r.final for r in rows]], dtype=np.bool_),
        "mux_status": np.concatenate([response_status.pack(r.arrays) for r in rows])[None],
        "mux_token_counts": np.array([[len(ids) for ids in new]], dtype=np.int32),
        "mux_output_ids": np.concatenate(new).astype(np.int32)[None],
        "mux_preceding_counts": np.array([[len(ids) for ids in preceding]], dtype=np.int32),
        "mux_preceding_ids": np.concatenate(preceding).astype(np.int32)[None],
    }


def unpack(outputs: dict[str, np.ndarray]) -> list[Row]:
    """The rows of a channel response, each as the llm's own response would be (response_status packed)."""
    ids = outputs["mux_request_ids"].reshape(-1)
    finals = outputs["mux_final"].reshape(-1).tolist()
    status = outputs["mux_status"][0]
    new = np.split(outputs["mux_output_ids"].reshape(-1), np.cumsum(outputs["mux_token_counts"].reshape(-1))[:-1])
    preceding_ids, preceding_counts = outputs["mux_preceding_ids"].reshape(-1), outputs["mux_preceding_counts"]
    preceding = np.split(preceding_ids, np.cumsum(preceding_counts.reshape(-1))[:-1])
    return [
        Row(
            request_id=ids[i].decode(),
            arrays={
                "output_ids": new[i].reshape(1, 1, -1),
                "preceding_ids": preceding[i].reshape(1, -1),
                response_status.NAME: status[i][None],
            },
            final=finals[i],
        )
        for i in range(len(ids))
    ]
