"""Token ids in, token ids out: stream from the `llm` model with TensorRT-LLM's InferenceRequest tensors.

python client/grpc_stream_llm.py 1 2 3 4 --max-tokens 16
"""

from __future__ import annotations

import argparse
import queue

import numpy as np
import tritonclient.grpc as grpcclient
from triton_tensors import tensor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("input_ids", type=int, nargs="+")
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--end-id", type=int, default=-1, help="-1: never stop on a token")
    args = parser.parse_args()

    inputs = [
        tensor("input_ids", np.array([args.input_ids], dtype=np.int32), "INT32"),
        tensor("request_output_len", np.array([[args.max_tokens]], dtype=np.int32), "INT32"),
        tensor("end_id", np.array([[args.end_id]], dtype=np.int32), "INT32"),
        tensor("streaming", np.array([[True]]), "BOOL"),
    ]
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(args.url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("llm", inputs)
    generated = []
    try:
        while True:
            result, error = responses.get()
            if error is not None:
                raise SystemExit(f"error: {error}")
            new = result.as_numpy("output_ids").reshape(-1).tolist()  # [1, beam, tokens]
            generated += new
            print(*new, flush=True)
            reason = result.as_numpy("finish_reason").reshape(-1)[0].decode()
            if reason:
                print(f"finish_reason={reason} output_ids={generated}")
                break
    finally:
        client.stop_stream()
        client.close()


if __name__ == "__main__":
    main()
