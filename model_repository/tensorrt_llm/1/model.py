"""TensorRT-LLM's `tensorrt_llm` model: each request relayed to the engine's model `llm` (a BLS call), its
answers given TensorRT-LLM's rules (tritonllm/backend/tensorrt_llm_face.py).

Decoupled or not as the config says (`serve --decoupled-mode`, TensorRT-LLM's `decoupled_mode`): either way
`execute()` hands each request to a thread of its own and returns, and that thread answers through the request's
response sender (one response, FINAL, without the decoupled policy), so unary requests batch in the engine as
streamed ones do. A request whose client went away is stopped in the llm by its request id.
"""

from __future__ import annotations

import logging
import threading
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.backend import stub_exit, tensorrt_llm_face
from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.backend.tensorrt_llm_relay import FINAL, Ending, generation_of, relay
from tritonllm.common import errors

log = logging.getLogger("tritonllm.tensorrt_llm")

CANCEL_POLL_S = 0.1
THREADS = "tensorrt_llm-"  # the prefix of this model's threads' names


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.llm = params.get("llm_model", "llm")
        self.exclude_input_default = params.exclude_input_in_output()
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(params.config)
        self.outputs = [o["name"] for o in params.config["output"]]
        self.live: set[Ending] = set()  # the requests being relayed, whose clients may go away
        self.lock = threading.Lock()
        self.closing = threading.Event()
        threading.Thread(target=self._watch_cancellations, name=f"{THREADS}cancel", daemon=True).start()

    def execute(self, requests: list) -> None:
        for request in requests:
            threading.Thread(target=self._relay, args=(request,), name=f"{THREADS}relay", daemon=True).start()

    def finalize(self) -> None:
        """Every relay has answered (Triton unloads only then); their threads end before the model lets go."""
        self.closing.set()
        for thread in threading.enumerate():
            if thread.name.startswith(THREADS) and thread is not threading.current_thread():
                thread.join(10)
        stub_exit.release(self)

    def _relay(self, request) -> None:
        sender = request.get_response_sender()
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}
        try:
            rows = tensorrt_llm_face.generations(inputs, self.exclude_input_default, self.decoupled)
        except Exception as e:  # a RequestError is the request's fault; anything else a bug, logged
            message = errors.to_message(e, request.request_id(), log)
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)
            return
        if "stop" in inputs or "pause" in inputs:  # the llm's control requests pass through as they are
            rows = rows[:1]
        wanted = frozenset(request.requested_output_names() or self.outputs)
        request_id = request.request_id() or uuid.uuid4().hex
        ending = Ending(len(rows), sender, self.decoupled, request_id)
        with self.lock:
            self.live.add(ending)
        threads = [
            threading.Thread(
                target=self._generate,
                args=(row, i if len(rows) > 1 else None, wanted, request_id, ending),
                name=f"{THREADS}generate",
            )
            for i, row in enumerate(rows)
        ]
        for thread in threads:
            thread.start()

    def _generate(self, row: dict, batch_index: int | None, wanted: frozenset[str], request_id: str, ending) -> None:
        llm_request = pb_utils.InferenceRequest(
            model_name=self.llm,
            inputs=[pb_utils.Tensor(name, array) for name, array in row.items()],
            requested_output_names=sorted(
                (wanted & set(self.outputs)) - {"batch_index"} | set(tensorrt_llm_face.RELAY_OUTPUTS)
            ),
            request_id=request_id,
        )
        answered = False  # its last answer went out
        try:
            generation = generation_of(row, wanted, batch_index)
            answered = relay(llm_request.exec(decoupled=True), generation, ending, "stop" in row or "pause" in row)
        finally:
            if not answered:
                ending.close()
            if ending.finished:
                with self.lock:
                    self.live.discard(ending)

    def _watch_cancellations(self) -> None:
        while not self.closing.wait(CANCEL_POLL_S):
            with self.lock:
                live = list(self.live)
            gone = [ending for ending in live if ending.cancelled()]
            with self.lock:
                self.live.difference_update(gone)  # each stopped once
            for request_id in {ending.request_id for ending in gone}:
                stop = pb_utils.InferenceRequest(
                    model_name=self.llm,
                    inputs=[pb_utils.Tensor("stop", np.array([[True]]))],
                    requested_output_names=[],
                    request_id=request_id,
                )
                for _ in stop.exec(decoupled=True):
                    pass
