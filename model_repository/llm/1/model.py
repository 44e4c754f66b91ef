"""Triton adapter of the engine: InferenceRequest tensors in, streamed token responses out.

`execute()` only validates and hands requests to the engine thread; responses are sent from that thread.
A request with `stop` set cancels the live requests that carry the same Triton request id, which is how
clients of the ensemble (into whose steps Triton forwards no cancellation) end a generation early.
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.engine_thread import EngineThread, Submission
from tritonllm.engine.sampling_params import NO_END_ID, SamplingParams
from tritonllm.engine.sequence import FinishReason, Sequence
from tritonllm.runtime.model_config import ModelParameters
from tritonllm.tokenizer.detokenizer import CONTEXT_TOKENS

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
UINT64_MAX = (1 << 64) - 1


def _scalar(request, name: str, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy()
    if array.size != 1:
        raise ValueError(f"{name} must hold exactly one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0].item()


def _sampling_params(request) -> SamplingParams:
    max_tokens = _scalar(request, "request_output_len")
    if max_tokens is None:
        raise ValueError("request_output_len is required")
    if max_tokens < 1:
        raise ValueError(f"request_output_len must be >= 1, got {max_tokens}")
    temperature = _scalar(request, "temperature")
    top_k = _scalar(request, "runtime_top_k")
    top_p = _scalar(request, "runtime_top_p")
    if temperature is not None and temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"runtime_top_k must be >= 0, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"runtime_top_p must be in (0, 1], got {top_p}")
    seed = _scalar(request, "random_seed")
    if seed is not None and not 0 <= seed <= UINT64_MAX:
        raise ValueError(f"random_seed must be a uint64, got {seed}")
    end_id = _scalar(request, "end_id", NO_END_ID)
    sampled = temperature is not None or top_k is not None or top_p is not None
    return SamplingParams(
        max_tokens=int(max_tokens),
        # As in TensorRT-LLM, a request that sets none of the sampling tensors decodes greedily.
        temperature=float(1.0 if temperature is None else temperature) if sampled else 0.0,
        top_k=int(top_k or 0),
        top_p=float(1.0 if top_p is None else top_p),
        seed=None if seed is None else int(seed),
        end_id=int(end_id),
    )


def _prompt(request) -> list[int]:
    tensor = pb_utils.get_input_tensor_by_name(request, "input_ids")
    if tensor is None:
        raise ValueError("input_ids is required")
    ids = tensor.as_numpy()
    if ids.ndim == 2 and ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [1, num_input_tokens]; one sequence per request, got {list(ids.shape)}")
    return ids.reshape(-1).astype(np.int64).tolist()


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        config = EngineConfig(
            model_dir=str(params.model_dir()),
            dtype=params.get("dtype", "float32"),
            device=params.get("device", "auto"),
            num_kv_blocks=params.int("num_kv_blocks", 1024),
            block_size=params.int("block_size", 16),
            max_num_seqs=params.int("max_num_seqs", 64),
            max_num_batched_tokens=params.int("max_num_batched_tokens", 512),
        )
        self.engine = LLMEngine(config)
        self.metrics = EngineMetrics()
        self.thread = EngineThread(self.engine, on_step=self.metrics.update)
        self.thread.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                if _scalar(request, "stop", False):
                    self.thread.cancel(request.request_id())
                    sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
                    continue
                seq = Sequence(_prompt(request), _sampling_params(request), request_id=request.request_id())
                self.engine.validate(seq.prompt_ids)
            except (ValueError, TypeError) as e:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=FINAL)
                continue
            streaming = bool(_scalar(request, "streaming", False))
            self.thread.submit(Submission(seq, Responder(sender, streaming, self.metrics), sender.is_cancelled))
        return None

    def finalize(self) -> None:
        self.thread.shutdown()


class Responder:
    """Turns engine outputs of one request into Triton responses; runs on the engine thread."""

    def __init__(self, sender, streaming: bool, metrics: EngineMetrics) -> None:
        self.sender = sender
        self.streaming = streaming
        self.metrics = metrics

    def __call__(self, out) -> None:
        seq = out.seq
        if self.streaming:
            new = out.new_token_ids
        elif out.finished:
            new = seq.output_ids
        else:
            return
        start = len(seq.token_ids) - len(new)
        preceding = seq.token_ids[max(0, start - CONTEXT_TOKENS) : start]
        tensors = [
            pb_utils.Tensor("output_ids", np.array([[new]], dtype=np.int32).reshape(1, 1, len(new))),
            pb_utils.Tensor("sequence_length", np.array([[len(new)]], dtype=np.int32)),
            pb_utils.Tensor("preceding_ids", np.array([preceding], dtype=np.int32).reshape(1, len(preceding))),
            pb_utils.Tensor("finish_reason", np.array([[_reason(seq)]], dtype=np.object_)),
            pb_utils.Tensor("num_input_tokens", np.array([[seq.num_prompt_tokens]], dtype=np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([[seq.num_output_tokens]], dtype=np.int32)),
            pb_utils.Tensor("batch_size", np.array([[out.batch_size]], dtype=np.int32)),
            pb_utils.Tensor("queue_wait_us", np.array([[int(seq.queue_wait() * 1e6)]], dtype=np.int64)),
        ]
        if out.finished:
            self.metrics.finished(seq.finish_reason)
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if out.finished else 0)


def _reason(seq) -> bytes:
    return seq.finish_reason.value.encode() if seq.is_finished and seq.finish_reason else b""


class EngineMetrics:
    """Prometheus gauges, set only from the engine thread (tritonserver 2.51 crashes on two threads)."""

    def __init__(self) -> None:
        gauge = pb_utils.MetricFamily.GAUGE
        # The families are kept: a collected family makes later calls on its metrics fail.
        self.families = {
            name: pb_utils.MetricFamily(name=f"tritonllm_{name}", description=text, kind=gauge)
            for name, text in {
                "kv_blocks_used": "KV cache blocks in use",
                "kv_blocks_free": "KV cache blocks free",
                "requests_running": "Sequences in the running batch",
                "requests_waiting": "Sequences waiting for admission",
                "batch_size": "Sequences in the last engine step",
            }.items()
        }
        self.metrics = {name: family.Metric(labels={}) for name, family in self.families.items()}
        self.last: dict[str, int] = {}
        self.finished_family = pb_utils.MetricFamily(
            name="tritonllm_requests_finished_total",
            description="Requests ended, by finish reason",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.finished_by_reason = {
            reason: self.finished_family.Metric(labels={"reason": reason.value}) for reason in FinishReason
        }

    def finished(self, reason: FinishReason) -> None:
        self.finished_by_reason[reason].increment(1)

    def update(self, engine: LLMEngine) -> None:
        values = {
            "kv_blocks_used": engine.blocks.num_used,
            "kv_blocks_free": engine.blocks.num_free,
            "requests_running": len(engine.scheduler.running),
            "requests_waiting": len(engine.scheduler.waiting),
            "batch_size": engine.last_batch_size,
        }
        for name, value in values.items():
            if self.last.get(name) != value:
                self.metrics[name].set(value)
                self.last[name] = value
