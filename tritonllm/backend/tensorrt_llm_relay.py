"""The `tensorrt_llm` model's relay of one generation: the llm's responses to a BLS call turned into TensorRT-LLM's
answers (tensorrt_llm_face.Generation) and sent on the client's sender, which a request's generations share."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import triton_python_backend_utils as pb_utils

from tritonllm.backend import tensorrt_llm_face
from tritonllm.common.request_parameters import scalar

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Ending:
    """The client's sender shared by a request's generations: FINAL goes on the last generation's last
    response; without the decoupled policy exactly one response goes out."""

    def __init__(self, generations: int, sender, decoupled: bool, request_id: str) -> None:
        self.open = generations
        self.sender = sender
        self.decoupled = decoupled
        self.request_id = request_id
        self.finished = False  # the FINAL response is out
        self.lock = threading.Lock()

    def send(self, response, last: bool) -> None:
        """`last`: the generation's last answer, which closes its share of FINAL."""
        with self.lock:
            if last:
                self.open -= 1
            if not self.decoupled and not last:
                return
            final = last and self.open == 0
            self.sender.send(response, flags=FINAL if final else 0)
            self.finished = self.finished or final

    def close(self) -> None:
        """A generation whose llm stream ended without its last answer (it was stopped): its share of FINAL."""
        with self.lock:
            self.open -= 1
            if self.open == 0:
                self.sender.send(flags=FINAL)
                self.finished = True

    def cancelled(self) -> bool:
        """Whether the client went away. Never asked once the FINAL response is out: Triton frees the sender's
        response factory with it, and asking then crashes tritonserver (TRITONBACKEND_ResponseFactoryIsCancelled)."""
        with self.lock:
            return not self.finished and self.sender.is_cancelled()


def generation_of(row: dict, wanted: frozenset[str], batch_index: int | None) -> tensorrt_llm_face.Generation:
    """The answers one row of a request expects."""
    end_id = scalar(row.get, "end_id", -1)
    samples = 1 if scalar(row.get, "beam_width", 1) > 1 else scalar(row.get, "num_return_sequences", 1)
    return tensorrt_llm_face.Generation(wanted, None if end_id < 0 else end_id, batch_index, samples)


def relay(responses: Iterable, generation: tensorrt_llm_face.Generation, ending: Ending, control: bool) -> bool:
    """Sends the llm's `responses` to the client as TensorRT-LLM answers; whether the generation's last answer went
    out. `control`: a stop or pause request, which TensorRT-LLM answers with one response of no outputs."""
    for response in responses:
        if response.has_error():
            ending.send(pb_utils.InferenceResponse(error=response.error()), last=True)
            return True
        arrays = {t.name(): t.as_numpy() for t in response.output_tensors()}
        if "finish_reason" not in arrays and control:  # TensorRT-LLM answers a stop with no outputs
            ending.send(pb_utils.InferenceResponse(output_tensors=[]), last=True)
            return True
        if "finish_reason" not in arrays:  # an empty FINAL
            continue
        answer = generation.response(arrays)
        ending.send(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in answer.items()]), generation.done)
        if generation.done:
            return True
    return False
