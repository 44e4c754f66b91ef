"""Triton adapter of the engine: InferenceRequest tensors in, streamed token responses out.

`execute()` only validates and hands requests to the engine thread; responses are sent from that thread.
A request with `stop` set cancels the live requests that carry the same Triton request id, which is how
clients of the ensemble (into whose steps Triton forwards no cancellation) end a generation early.
"""

from __future__ import annotations

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from tritonllm.engine import inference_request
from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.engine_thread import EngineThread, Overloaded, Submission
from tritonllm.engine.sequence import FinishReason, Sequence
from tritonllm.runtime.model_config import ModelParameters
from tritonllm.tokenizer.detokenizer import CONTEXT_TOKENS

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


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
            enable_prefix_caching=params.bool("enable_prefix_caching", True),
        )
        self.engine = LLMEngine(config)
        self.metrics = EngineMetrics()
        self.thread = EngineThread(
            self.engine, on_step=self.metrics.update, max_queue_size=params.int("max_queue_size", 256)
        )
        self.thread.start()

    def execute(self, requests: list) -> None:
        vocab = self.engine.runner.shape.vocab_size
        for request in requests:
            sender = request.get_response_sender()

            def get(name: str, request=request):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                return None if tensor is None else tensor.as_numpy()

            try:
                if inference_request.is_stop_request(get):
                    self.thread.cancel(request.request_id())
                    sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
                    continue
                parsed = inference_request.parse(get, vocab, request.timeout())
                self.engine.validate(parsed.prompt_ids)
                seq = Sequence(
                    parsed.prompt_ids, parsed.params, request_id=request.request_id(), priority=parsed.priority
                )
                if parsed.timeout_s is not None:
                    seq.deadline = seq.arrival_time + parsed.timeout_s
                responder = Responder(sender, parsed.streaming, self.metrics)
                self.thread.submit(Submission(seq, responder, sender.is_cancelled))
            except (ValueError, TypeError, Overloaded) as e:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=FINAL)
        return None

    def finalize(self) -> None:
        self.thread.shutdown()


class Responder:
    """Turns engine outputs of one request into Triton responses; runs on the engine thread.

    Streaming responses carry the new tokens; a non-streaming request gets one response with all of them.
    """

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
            pb_utils.Tensor("output_ids", np.array(new, dtype=np.int32).reshape(1, 1, len(new))),
            pb_utils.Tensor("sequence_length", np.array([[len(new)]], dtype=np.int32)),
            pb_utils.Tensor("preceding_ids", np.array(preceding, dtype=np.int32).reshape(1, len(preceding))),
            pb_utils.Tensor("finish_reason", np.array([[_reason(seq)]], dtype=np.object_)),
            pb_utils.Tensor("num_input_tokens", np.array([[seq.num_prompt_tokens]], dtype=np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([[seq.num_output_tokens]], dtype=np.int32)),
            pb_utils.Tensor("batch_size", np.array([[out.batch_size]], dtype=np.int32)),
            pb_utils.Tensor("queue_wait_us", np.array([[int(seq.queue_wait() * 1e6)]], dtype=np.int64)),
            *self._requested(seq, len(new)),
        ]
        if out.finished:
            self.metrics.finished(seq.finish_reason)
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if out.finished else 0)

    def _requested(self, seq, num_new: int) -> list:
        """The optional outputs the request asked for, covering this response's tokens."""
        p, tensors = seq.params, []
        first = seq.num_output_tokens - num_new
        if p.return_log_probs:
            logprobs = np.array(seq.logprobs[first:], dtype=np.float32)
            tensors.append(pb_utils.Tensor("output_log_probs", logprobs.reshape(1, 1, -1)))
            tensors.append(pb_utils.Tensor("cum_log_probs", np.array([[sum(seq.logprobs)]], dtype=np.float32)))
        if p.top_log_probs:
            top = seq.top_logprobs[first:]
            shape = (1, 1, len(top), p.top_log_probs)
            ids = np.array([t[0] for t in top], dtype=np.int32).reshape(shape)
            values = np.array([t[1] for t in top], dtype=np.float32).reshape(shape)
            tensors += [pb_utils.Tensor("top_log_prob_ids", ids), pb_utils.Tensor("top_log_probs", values)]
        if p.return_context_logits and first == 0 and seq.context_logits:
            context = torch.stack(seq.context_logits).numpy()
            tensors.append(pb_utils.Tensor("context_logits", context[None]))
        if p.return_generation_logits and num_new:
            generation = torch.stack(seq.generation_logits[first:]).numpy()
            tensors.append(pb_utils.Tensor("generation_logits", generation[None, None]))
        return tensors


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
