"""Text in, text out: stream tokens from the `ensemble` with tritonclient over gRPC.

    python client/grpc_stream_ensemble.py "Hello, who are you?" --max-tokens 64

Ctrl-C ends the generation on the server too: the example sends `llm` a `stop` request carrying the same
request id, and prints the stream to its final response ("cancelled").
"""

from __future__ import annotations

import argparse
import queue
import uuid

import numpy as np
import tritonclient.grpc as grpcclient
from triton_tensors import tensor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("prompt")
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, help="scales the logits when sampling")
    # TensorRT-LLM's rule: greedy unless top-k (> 1) or top-p asks to sample, whatever the temperature
    parser.add_argument("--top-p", type=float, help="sample from the smallest set of this probability (1.0: all)")
    args = parser.parse_args()

    inputs = [
        tensor("text_input", np.array([[args.prompt.encode()]], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([[args.max_tokens]], dtype=np.int32), "INT32"),
        tensor("stream", np.array([[True]]), "BOOL"),
    ]
    if args.temperature is not None:
        inputs.append(tensor("temperature", np.array([[args.temperature]], dtype=np.float32), "FP32"))
    if args.top_p is not None:
        inputs.append(tensor("top_p", np.array([[args.top_p]], dtype=np.float32), "FP32"))

    request_id = uuid.uuid4().hex
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(args.url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("ensemble", inputs, request_id=request_id)
    try:
        print_until_final(responses)
    except KeyboardInterrupt:
        # A stop request ends the generation, which then ends its stream. Cancelling the stream instead would not
        # reach the ensemble's steps, and can crash tritonserver 2.51 (a race in its gRPC frontend).
        stopper = grpcclient.InferenceServerClient(args.url)
        stopper.start_stream(callback=lambda *_: None)
        stopper.async_stream_infer("llm", [tensor("stop", np.array([[True]]), "BOOL")], request_id=request_id)
        stopper.stop_stream()
        stopper.close()
        print_until_final(responses)
    finally:
        client.stop_stream()
        client.close()


def print_until_final(responses: queue.Queue) -> None:
    while True:
        result, error = responses.get()
        if error is not None:
            raise SystemExit(f"error: {error}")
        print(result.as_numpy("text_output").reshape(-1)[0].decode(), end="", flush=True)
        reason = result.as_numpy("finish_reason").reshape(-1)[0].decode()
        if reason:
            print(f"\n[finish_reason={reason}, tokens={result.as_numpy('num_output_tokens').item()}]")
            return


if __name__ == "__main__":
    main()
