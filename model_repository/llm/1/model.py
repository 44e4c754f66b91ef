"""Triton adapter of the engine: InferenceRequest tensors in, streamed token responses out.

`execute()` only validates and hands requests to the engine thread; responses are sent from that thread.
A request with `stop` set cancels the live requests that carry the same Triton request id, which is how
clients of the ensemble (into whose steps Triton forwards no cancellation) end a generation early.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from tritonllm.engine import inference_request, lora
from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.engine_thread import EngineThread, Overloaded, Submission, load_on_own_thread
from tritonllm.engine.grammar import GrammarCompiler
from tritonllm.engine.logits_processors import matched_word
from tritonllm.engine.lora import AdapterCache
from tritonllm.engine.sequence import FinishReason, samples_of
from tritonllm.runtime import gguf, response_status
from tritonllm.runtime.coalesce import PendingResponse, coalesce
from tritonllm.runtime.model_config import ModelParameters, load_tokenizer
from tritonllm.runtime.stream_interval import StreamInterval
from tritonllm.tokenizer.detokenizer import CONTEXT_TOKENS

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger(__name__)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        lora_cache_size = params.int("lora_cache_size", 8)
        model_dir = params.model_dir()
        gguf_file = gguf.source_file(model_dir) if params.bool("quantized_weights", True) else None
        config = EngineConfig(
            model_dir=str(model_dir),
            dtype=params.get("dtype", "float32"),
            device=params.get("device", "auto"),
            num_kv_blocks=params.int("num_kv_blocks", 1024),
            block_size=params.int("block_size", 16),
            max_num_seqs=params.int("max_num_seqs", 64),
            max_num_batched_tokens=params.int("max_num_batched_tokens", 512),
            enable_prefix_caching=params.bool("enable_prefix_caching", True),
            enable_lora=lora_cache_size > 0,
            prefill_slowdown=params.float("prefill_slowdown", 2.0),
            gguf_file=str(gguf_file) if gguf_file else None,
        )
        self.engine = load_on_own_thread(lambda: LLMEngine(config))
        self.grammars = GrammarCompiler(load_tokenizer(model_dir))
        self.hidden_size = self.engine.runner.model.config.hidden_size
        self.adapters = AdapterCache(lora_cache_size)
        self.stream_interval = params.int("stream_interval", 1)
        StreamInterval(self.stream_interval)  # refuses a bad value at load
        self.metrics = EngineMetrics()
        self.responses = ResponseQueue()
        self.thread = EngineThread(
            self.engine,
            on_step=self.metrics.update,
            max_queue_size=params.int("max_queue_size", 256),
            nice=params.int("engine_nice", 0),
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
                parsed = inference_request.parse(get, vocab, request.timeout(), self.hidden_size)
                table = parsed.prompt_table
                self.engine.validate(parsed.prompt_ids, 0 if table is None else len(table))
                beams = parsed.num_samples if parsed.params.beam_width > 1 else 0
                samples = samples_of(
                    parsed.prompt_ids,
                    parsed.params,
                    1 if beams else parsed.num_samples,
                    request_id=request.request_id(),
                    priority=parsed.priority,
                    prompt_table=table,
                    adapter=self._adapter(get),
                    draft_tokens=parsed.draft_tokens,
                    draft_logits=parsed.draft_logits,
                    deadline=None if parsed.timeout_s is None else time.monotonic() + parsed.timeout_s,
                )
                if parsed.guide is not None:
                    for seq in samples:
                        seq.grammar = self.grammars.matcher(*parsed.guide)
                group = SampleGroup(len(samples))
                wanted = frozenset(request.requested_output_names())
                self.thread.submit(
                    [
                        Submission(
                            seq,
                            Responder(
                                sender,
                                wanted,
                                parsed,
                                self.metrics,
                                self.responses,
                                group,
                                StreamInterval(parsed.stream_interval or self.stream_interval),
                                beams,
                            ),
                            sender.is_cancelled,
                        )
                        for seq in samples
                    ]
                )
            except (ValueError, TypeError, Overloaded) as e:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=FINAL)
        return None

    def _adapter(self, get):
        task_id = inference_request.scalar(get, "lora_task_id")
        weights, config = get("lora_weights"), get("lora_config")
        if task_id is None:
            if weights is not None or config is not None:
                raise ValueError("lora_weights and lora_config need a lora_task_id")
            return None
        if self.engine.runner.lora is None:
            raise ValueError("lora_task_id: LoRA is disabled on this model (parameter lora_cache_size is 0)")
        return lora.resolve(self.adapters, int(task_id), weights, config, self.engine.runner.model)

    def finalize(self) -> None:
        self.thread.shutdown()
        self.responses.close()
        self.metrics.close()


class ResponseQueue:
    """Builds and sends responses on a thread of its own, so the engine thread never waits on Triton's IPC.

    One thread, first in first out: a request's responses keep their order and the FINAL one comes last. What
    has queued up while a send was under way is merged per sequence first (tritonllm.runtime.coalesce).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llm-responses", daemon=True)
        self._thread.start()

    def put(self, sender, wanted: frozenset[str], arrays: dict[str, np.ndarray], final: bool, stream_key=None) -> None:
        """`wanted`: the output names the request asked for (in the ensemble: the ones its steps map)."""
        self._queue.put(PendingResponse(sender, arrays, final, wanted, stream_key))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        closing = False
        while not closing:
            pending, closing = _take_queued(self._queue)
            for response in coalesce(pending):
                try:
                    arrays = response.arrays
                    if response_status.NAME in response.wanted:
                        arrays = {**arrays, response_status.NAME: response_status.pack(arrays)}
                    tensors = [pb_utils.Tensor(name, a) for name, a in arrays.items() if name in response.wanted]
                    response.sender.send(
                        pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if response.final else 0
                    )
                except Exception:
                    log.exception("could not send a response")


def _take_queued(items: queue.SimpleQueue) -> tuple[list, bool]:
    """Waits for one item, then takes all that are queued; True when the None that ends the queue was among them."""
    taken = [items.get()]
    while not items.empty():
        taken.append(items.get())
    return [item for item in taken if item is not None], None in taken


class SampleGroup:
    """The samples of one request: Triton's FINAL flag goes on the response of the last one to finish."""

    def __init__(self, size: int) -> None:
        self.unfinished = size


class Responder:
    """Turns engine outputs of one sample into response tensors; runs on the engine thread.

    Streaming responses carry the new tokens, every `stream_interval` of them (the request's, else the model's);
    a non-streaming request gets one response per sample with all of them. `sequence_index` tells the samples of
    a request apart.
    """

    def __init__(
        self,
        sender,
        wanted: frozenset[str],
        request: inference_request.ParsedRequest,
        metrics: EngineMetrics,
        responses: ResponseQueue,
        group: SampleGroup,
        pacing: StreamInterval,
        beams: int = 0,
    ) -> None:
        self.sender = sender
        self.wanted = wanted
        self.streaming = request.streaming
        self.metrics = metrics
        self.responses = responses
        self.group = group
        self.drafted = bool(request.draft_tokens)  # report how many drafts were accepted
        self.include_stop_words = request.include_stop_words
        self.detokenizing = {"skip_special_tokens": np.array([[request.skip_special_tokens]])}
        self.beams = beams  # beam search: how many of the best beams the final response carries
        self.pacing = pacing

    def __call__(self, out) -> None:
        seq = out.seq
        if self.beams:
            if out.finished:
                self._send_beams(out)
            return
        if self.streaming:
            span = self.pacing.take(seq.num_output_tokens, out.finished)
            if span is None:
                return
            new = seq.output_ids[span]
        elif out.finished:
            new = seq.output_ids
        else:
            return
        start = len(seq.token_ids) - len(new)
        preceding = seq.token_ids[max(0, start - CONTEXT_TOKENS) : start]
        stop_word = matched_word(seq.output_ids, seq.params.stop_words) if out.finished else None
        if stop_word and not self.include_stop_words:
            new = new[: max(0, len(new) - len(stop_word))]
        arrays = {
            "output_ids": np.array(new, dtype=np.int32).reshape(1, 1, len(new)),
            "sequence_length": np.array([[len(new)]], dtype=np.int32),
            "preceding_ids": np.array(preceding, dtype=np.int32).reshape(1, len(preceding)),
            "num_output_tokens": np.array([[seq.num_output_tokens]], dtype=np.int32),
            "sequence_index": np.array([[seq.sample_index]], dtype=np.int32),
            "stop_token": np.array([[stop_word[-1] if stop_word else -1]], dtype=np.int32),
            **self._status(out),
            **self._requested(seq, len(new)),
        }
        if out.finished:
            self.metrics.finished(seq.finish_reason)
            self.group.unfinished -= 1
        stream_key = (id(self.sender), seq.sample_index) if self.streaming else None
        self.responses.put(self.sender, self.wanted, arrays, self.group.unfinished == 0, stream_key)

    def _send_beams(self, out) -> None:
        """One final response with the best beams, padded with pad_id (their ends shift until the search ends,
        so even a streaming request gets them whole)."""
        seq = out.seq
        best = seq.beam.results()[: self.beams]
        width = max(len(h.output_ids) for h in best)
        pad = seq.params.pad_id

        def padded(rows, dtype, fill):
            return np.array([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)[None]

        arrays = {
            "output_ids": padded([h.output_ids for h in best], np.int32, pad),
            "sequence_length": np.array([[len(h.output_ids) for h in best]], dtype=np.int32),
            "preceding_ids": np.zeros((1, 0), dtype=np.int32),
            "num_output_tokens": np.array([[len(best[0].output_ids)]], dtype=np.int32),
            "sequence_index": np.array([[0]], dtype=np.int32),
            "stop_token": np.array([[-1]], dtype=np.int32),
            **self._status(out),
            **NO_LOG_PROBS,
        }
        if seq.params.return_log_probs:
            arrays["output_log_probs"] = padded([h.log_probs for h in best], np.float32, 0.0)
            arrays["cum_log_probs"] = np.array([[h.cum_log_prob for h in best]], dtype=np.float32)
        if seq.params.return_context_logits and seq.context_logits:
            arrays["context_logits"] = torch.stack(seq.context_logits).numpy()[None]
        self.metrics.finished(seq.finish_reason)
        self.responses.put(self.sender, self.wanted, arrays, final=True)

    def _status(self, out) -> dict[str, np.ndarray]:
        """What every response says of its sequence: how it ended (if it did), its prompt, batch and queue wait."""
        seq = out.seq
        return {
            "finish_reason": np.array([[_reason(seq)]], dtype=np.object_),
            "num_input_tokens": np.array([[seq.num_prompt_tokens]], dtype=np.int32),
            "batch_size": np.array([[out.batch_size]], dtype=np.int32),
            "queue_wait_us": np.array([[int(seq.queue_wait() * 1e6)]], dtype=np.int64),
            **self.detokenizing,
        }

    def _requested(self, seq, num_new: int) -> dict[str, np.ndarray]:
        """The outputs the request asked for, covering this response's tokens. The log-prob outputs are always
        there (empty unless asked for), because the ensemble hands them to postprocessing."""
        p, arrays = seq.params, dict(NO_LOG_PROBS)
        first = seq.num_output_tokens - num_new
        if p.return_log_probs:
            arrays["output_log_probs"] = np.array(seq.logprobs[first:], dtype=np.float32).reshape(1, 1, -1)
            arrays["cum_log_probs"] = np.array([[sum(seq.logprobs)]], dtype=np.float32)
        if p.top_log_probs:
            top = seq.top_logprobs[first:]
            shape = (1, 1, len(top), p.top_log_probs)
            arrays["top_log_prob_ids"] = np.array([t[0] for t in top], dtype=np.int32).reshape(shape)
            arrays["top_log_probs"] = np.array([t[1] for t in top], dtype=np.float32).reshape(shape)
        if p.return_context_logits and first == 0 and seq.context_logits:
            arrays["context_logits"] = torch.stack(seq.context_logits).numpy()[None]
        if p.return_prompt_log_probs and first == 0:
            arrays["prompt_log_probs"] = _prompt_log_probs(seq)
        if self.drafted:
            arrays["num_accepted_draft_tokens"] = np.array([[seq.accepted_drafts]], dtype=np.int32)
        if p.return_generation_logits and num_new:
            arrays["generation_logits"] = torch.stack(seq.generation_logits[first:]).numpy()[None, None]
        return arrays


NO_LOG_PROBS = {
    "output_log_probs": np.zeros((1, 1, 0), dtype=np.float32),
    "top_log_probs": np.zeros((1, 1, 0, 0), dtype=np.float32),
    "top_log_prob_ids": np.zeros((1, 1, 0, 0), dtype=np.int32),
    "prompt_log_probs": np.zeros((1, 0, 2), dtype=np.float32),
}


def _prompt_log_probs(seq) -> np.ndarray:
    """[1, prompt, 2 + 2k]: per prompt token, its id and log-probability given the tokens before it, then the
    ids and log-probabilities of the k best alternatives; the first token, which nothing predicts, has NaNs."""
    k = seq.params.top_log_probs
    tops = seq.prompt_top_logprobs or [([], [])] * len(seq.prompt_logprobs)
    rows = [[seq.prompt_ids[0], *[np.nan] * (1 + 2 * k)]]
    rows += [
        [token, logprob, *ids, *values]
        for token, logprob, (ids, values) in zip(seq.prompt_ids[1:], seq.prompt_logprobs, tops, strict=True)
    ]
    return np.array(rows, dtype=np.float32).reshape(1, len(rows), 2 + 2 * k)


def _reason(seq) -> bytes:
    return seq.finish_reason.value.encode() if seq.is_finished and seq.finish_reason else b""


class EngineMetrics:
    """Prometheus metrics, touched only from a thread of their own (tritonserver 2.51 crashes on two threads).

    Every metric call is a round trip to the server, so the engine thread only reads its numbers and hands them
    over. Gauges are set when their value changes; counters grow by the engine's totals since the last update;
    latency histograms observe every token's time to first token or inter-token latency.
    """

    GAUGES = {
        "kv_blocks_used": "KV cache blocks in use",
        "kv_blocks_free": "KV cache blocks free",
        "requests_running": "Sequences in the running batch",
        "requests_waiting": "Sequences waiting for admission",
        "batch_size": "Sequences in the last engine step",
        "step_tokens": "Tokens (prefill and decode) in the last engine step",
    }
    COUNTERS = {
        "prompt_tokens_total": "Prompt tokens of requests that started",
        "generation_tokens_total": "Tokens generated",
        "preemptions_total": "Sequences preempted for lack of KV blocks or for priority",
        "prefix_cache_hit_tokens_total": "Prompt tokens served from the prefix cache",
        "prefix_cache_queried_tokens_total": "Prompt tokens looked up in the prefix cache",
        "engine_steps_total": "Engine steps run",
    }
    HISTOGRAMS = {
        "time_to_first_token_seconds": (
            "From arrival to the first token",
            [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
        ),
        "inter_token_latency_seconds": (
            "Between consecutive tokens",
            [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28],
        ),
        "queue_time_seconds": ("From arrival to first scheduling", [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10]),
    }

    def __init__(self) -> None:
        # Every family is kept: a collected family makes later calls on its metrics fail.
        self.families = []

        def family(name: str, text: str, kind):
            self.families.append(pb_utils.MetricFamily(name=f"tritonllm_{name}", description=text, kind=kind))
            return self.families[-1]

        kinds = pb_utils.MetricFamily
        self.gauges = {n: family(n, t, kinds.GAUGE).Metric(labels={}) for n, t in self.GAUGES.items()}
        self.counters = {n: family(n, t, kinds.COUNTER).Metric(labels={}) for n, t in self.COUNTERS.items()}
        self.histograms = {
            n: family(n, t, kinds.HISTOGRAM).Metric(labels={}, buckets=b) for n, (t, b) in self.HISTOGRAMS.items()
        }
        finished = family("requests_finished_total", "Requests ended, by finish reason", kinds.COUNTER)
        self.finished_by_reason = {r: finished.Metric(labels={"reason": r.value}) for r in FinishReason}
        self.last: dict[str, float] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llm-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def finished(self, reason: FinishReason) -> None:
        self._queue.put(reason)

    def update(self, engine: LLMEngine) -> None:
        """On the engine thread: reads the engine's numbers for the metrics thread."""
        stats, blocks = engine.stats, engine.blocks
        gauges = {
            "kv_blocks_used": blocks.num_used,
            "kv_blocks_free": blocks.num_free,
            "requests_running": len(engine.scheduler.running),
            "requests_waiting": len(engine.scheduler.waiting),
            "batch_size": stats.last_batch_size,
            "step_tokens": stats.last_step_tokens,
        }
        totals = {
            "prompt_tokens_total": stats.prompt_tokens,
            "generation_tokens_total": stats.generation_tokens,
            "preemptions_total": engine.scheduler.num_preemptions,
            "prefix_cache_hit_tokens_total": blocks.prefix_hit_tokens,
            "prefix_cache_queried_tokens_total": blocks.prefix_queried_tokens,
            "engine_steps_total": stats.steps,
        }
        self._queue.put((gauges, totals, stats.drain()))

    def _run(self) -> None:
        """Applies what has queued up at once: the latest gauges and totals, every latency observed."""
        closing = False
        while not closing:
            items, closing = _take_queued(self._queue)
            steps = [item for item in items if isinstance(item, tuple)]
            try:
                for reason in (item for item in items if isinstance(item, FinishReason)):
                    self.finished_by_reason[reason].increment(1)
                if steps:
                    latencies = [[v for step in steps for v in step[2][i]] for i in range(len(self.HISTOGRAMS))]
                    self._apply(steps[-1][0], steps[-1][1], latencies)
            except Exception:
                log.exception("could not update the metrics")

    def _apply(self, gauges: dict[str, float], totals: dict[str, float], latencies: list[list[float]]) -> None:
        for name, value in gauges.items():
            if self.last.get(name) != value:
                self.gauges[name].set(value)
                self.last[name] = value
        for name, value in totals.items():
            grown = value - self.last.get(name, 0)
            if grown:
                self.counters[name].increment(grown)
                self.last[name] = value
        for name, values in zip(self.HISTOGRAMS, latencies, strict=True):
            for value in values:
                self.histograms[name].observe(value)
