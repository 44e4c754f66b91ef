"""The llm model's responses: built on the engine thread (Responder), sent from a thread of their own
(ResponseQueue), so the engine never waits on Triton's IPC. Imported only inside Triton's Python backend."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from tritonllm.backend.coalesce import PendingResponse, coalesce
from tritonllm.backend.stream_interval import StreamInterval
from tritonllm.engine.decoding.logits_processors import matched_word
from tritonllm.engine.state import inference_request
from tritonllm.engine.state.sequence import Sequence
from tritonllm.tokenizer.detokenizer import CONTEXT_TOKENS
from tritonllm.wire import multiplex, response_status

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger(__name__)


class ResponseQueue:
    """Builds and sends responses on a thread of its own, so the engine thread never waits on Triton's IPC.

    One thread, first in first out: a request's responses keep their order and the FINAL one comes last. What
    has queued up while a send was under way is merged per sequence first (tritonllm.backend.coalesce), and the
    responses of generations on a multiplexed channel go out as one response on it (tritonllm.wire.multiplex),
    before their requests' FINAL flags.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llm-responses", daemon=True)
        self._thread.start()

    def put(
        self, sender, wanted: frozenset[str], arrays: dict[str, np.ndarray], final: bool, stream_key=None, mux=None
    ) -> None:
        """`wanted`: the output names the request asked for (in the ensemble: the ones its steps map); `mux`: the
        channel's sender and the request's id, for a generation multiplexed on a channel."""
        self._queue.put(PendingResponse(sender, arrays, final, wanted, stream_key, mux))

    def end_channels(self, senders: list) -> None:
        """Sends each multiplexed channel's FINAL flag, after every response queued before."""
        self._queue.put(ChannelsEnd(senders))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        closing = False
        while not closing:
            items, closing = take_queued(self._queue)
            pending = [item for item in items if isinstance(item, PendingResponse)]
            channels: dict[int, tuple[object, list[multiplex.Row]]] = {}
            ended = []  # the requests of multiplexed generations that ended: their FINAL flags, after the rows
            for response in coalesce(pending):
                if response.mux is None:
                    arrays = response.arrays
                    if response_status.NAME in response.wanted:
                        arrays = {**arrays, response_status.NAME: response_status.pack(arrays)}
                    _send(response.sender, {k: a for k, a in arrays.items() if k in response.wanted}, response.final)
                    continue
                channel, request_id = response.mux
                rows = channels.setdefault(id(channel), (channel, []))[1]
                rows.append(multiplex.Row(request_id, response.arrays, response.final))
                if response.final:
                    ended.append(response.sender)
            for channel, rows in channels.values():
                _send(channel, multiplex.pack(rows), final=False)
            for sender in ended:
                _send(sender, {}, final=True)
            for end in (item for item in items if isinstance(item, ChannelsEnd)):
                for channel in end.senders:
                    _send(channel, {}, final=True)


@dataclass(frozen=True)
class ChannelsEnd:
    """Multiplexed channels to close (ResponseQueue.end_channels)."""

    senders: list


def _send(sender, arrays: dict[str, np.ndarray], final: bool) -> None:
    try:
        tensors = [pb_utils.Tensor(name, a) for name, a in arrays.items()]
        sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if final else 0)
    except Exception:
        log.exception("could not send a response")


def take_queued(items: queue.SimpleQueue) -> tuple[list, bool]:
    """Waits for one item, then takes all that are queued; True when the None that ends the queue was among them."""
    taken = [items.get()]
    while not items.empty():
        taken.append(items.get())
    return [item for item in taken if item is not None], None in taken


class SampleGroup:
    """The samples of one request: Triton's FINAL flag goes on the response of the last one to finish."""

    def __init__(self, size: int) -> None:
        self.unfinished = size


@dataclass(frozen=True)
class Channel:
    """Where the responses of one Triton request go: its sender, the outputs it wants (in the ensemble: the ones
    its steps map), the queue that sends them, and who hears of each sample that finishes."""

    sender: object
    wanted: frozenset[str]
    responses: ResponseQueue
    on_finished: Callable[[Sequence], None]  # the metrics' count, and the spans of a traced request
    mux: tuple[object, str] | None = None  # a multiplexed channel's sender and the request's id


class Responder:
    """Turns engine outputs of one sample into response tensors; runs on the engine thread.

    Streaming responses carry the new tokens, every `stream_interval` of them (the request's, else the model's);
    a non-streaming request gets one response per sample with all of them. `sequence_index` tells the samples of
    a request apart. With beam search (`beams` > 0), one final response carries that many best beams.
    """

    def __init__(
        self,
        channel: Channel,
        request: inference_request.ParsedRequest,
        group: SampleGroup,
        pacing: StreamInterval,
        beams: int = 0,
        batch_index: int | None = None,  # its row, when the request held several prompts (TensorRT-LLM's batch)
    ) -> None:
        self.channel = channel
        self.streaming = request.streaming
        self.group = group
        self.drafted = bool(request.draft_tokens)  # report how many drafts were accepted
        self.include_stop_words = request.include_stop_words
        self.detokenizing = {"skip_special_tokens": np.array([[request.skip_special_tokens]])}
        self.batch_index = batch_index
        self.beams = beams
        self.pacing = pacing
        # TensorRT-LLM's rule: unless excluded, a non-streaming response's output_ids start with the prompt
        self.echoed = [] if request.streaming or request.exclude_input else list(request.prompt_ids)
        self.perf_metrics = request.perf_metrics

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
        num_new = len(new)
        if self.echoed:
            new, preceding = self.echoed + list(new), []
        arrays = {
            "output_ids": np.array(new, dtype=np.int32).reshape(1, 1, len(new)),
            "sequence_length": np.array([[len(new)]], dtype=np.int32),
            "preceding_ids": np.array(preceding, dtype=np.int32).reshape(1, len(preceding)),
            "num_output_tokens": np.array([[seq.num_output_tokens]], dtype=np.int32),
            "sequence_index": np.array([[seq.sample_index]], dtype=np.int32),
            "stop_token": np.array([[stop_word[-1] if stop_word else -1]], dtype=np.int32),
            **self._status(out),
            **self._requested(seq, num_new, out.finished),
        }
        if self.perf_metrics:  # in every response, as TensorRT-LLM's: its streaming clients read each
            arrays.update(perf_metrics(seq))
        if out.finished:
            self.channel.on_finished(seq)
            self.group.unfinished -= 1
        # a stream's queued responses may merge; the rows and samples of one request are streams of their own
        stream_key = (id(self.channel.sender), self.batch_index, seq.sample_index) if self.streaming else None
        self._put(arrays, self.group.unfinished == 0, stream_key)

    def _send_beams(self, out) -> None:
        """One final response with the best beams, padded with pad_id (their ends shift until the search ends,
        so even a streaming request gets them whole)."""
        seq = out.seq
        best = seq.beam.results()[: self.beams]
        beams = [self.echoed + list(h.output_ids) for h in best]
        pad = seq.params.pad_id

        def padded(rows, dtype, fill):
            width = max(len(r) for r in rows)
            return np.array([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)[None]

        arrays = {
            "output_ids": padded(beams, np.int32, pad),
            "sequence_length": np.array([[len(b) for b in beams]], dtype=np.int32),
            "preceding_ids": np.zeros((1, 0), dtype=np.int32),
            "num_output_tokens": np.array([[len(best[0].output_ids)]], dtype=np.int32),
            "sequence_index": np.array([[0]], dtype=np.int32),
            "stop_token": np.array([[-1]], dtype=np.int32),
            **self._status(out),
        }
        if seq.params.return_log_probs:
            arrays["output_log_probs"] = padded([h.log_probs for h in best], np.float32, 0.0)
            arrays["cum_log_probs"] = np.array([[h.cum_log_prob for h in best]], dtype=np.float32)
        if seq.params.return_context_logits and seq.recorded.context_logits:
            arrays["context_logits"] = torch.stack(seq.recorded.context_logits).numpy()[None]
        if self.perf_metrics:
            arrays.update(perf_metrics(seq))
        self.channel.on_finished(seq)
        self._put(arrays, final=True)

    def _put(self, arrays: dict[str, np.ndarray], final: bool, stream_key=None) -> None:
        channel = self.channel
        channel.responses.put(channel.sender, channel.wanted, arrays, final, stream_key, channel.mux)

    def _status(self, out) -> dict[str, np.ndarray]:
        """What every response says of its sequence: how it ended (if it did), its prompt, batch and queue wait."""
        seq = out.seq
        return {
            "finish_reason": np.array([[_reason(seq)]], dtype=np.object_),
            "num_input_tokens": np.array([[seq.num_prompt_tokens]], dtype=np.int32),
            "batch_size": np.array([[out.batch_size]], dtype=np.int32),
            "queue_wait_us": np.array([[int(seq.queue_wait() * 1e6)]], dtype=np.int64),
            "accepted_prediction_tokens": np.array([[seq.speculation.accepted_prediction_tokens]], dtype=np.int32),
            "rejected_prediction_tokens": np.array([[seq.rejected_prediction_tokens]], dtype=np.int32),
            "end_id": np.array([[seq.params.end_id]], dtype=np.int32),
            **self.detokenizing,
            **({} if self.batch_index is None else {"batch_index": np.array([[self.batch_index]], dtype=np.int32)}),
        }

    def _requested(self, seq, num_new: int, finished: bool) -> dict[str, np.ndarray]:
        """The outputs the request asked for, covering this response's tokens (the ensemble's postprocessing takes
        each of them as optional: a tensor sent for nothing costs every hop of every streamed token)."""
        p, arrays = seq.params, {}
        first = seq.num_output_tokens - num_new
        if p.return_log_probs:
            arrays["output_log_probs"] = np.array(seq.recorded.logprobs[first:], dtype=np.float32).reshape(1, 1, -1)
            arrays["cum_log_probs"] = np.array([[sum(seq.recorded.logprobs)]], dtype=np.float32)
        if p.top_log_probs:
            top = seq.recorded.top_logprobs[first:]
            shape = (1, 1, len(top), p.top_log_probs)
            arrays["top_log_prob_ids"] = np.array([t[0] for t in top], dtype=np.int32).reshape(shape)
            arrays["top_log_probs"] = np.array([t[1] for t in top], dtype=np.float32).reshape(shape)
        if (
            p.return_context_logits and finished and seq.recorded.context_logits
        ):  # in the last response, as TensorRT-LLM
            arrays["context_logits"] = torch.stack(seq.recorded.context_logits).numpy()[None]
        if p.return_prompt_log_probs and first == 0:
            arrays["prompt_log_probs"] = _prompt_log_probs(seq)
        if p.return_prompt_ids and first == 0:
            arrays["prompt_ids"] = np.array([seq.prompt_ids], dtype=np.int32)
        if self.drafted:
            arrays["num_accepted_draft_tokens"] = np.array([[seq.speculation.accepted_drafts]], dtype=np.int32)
        if p.return_generation_logits and num_new:
            arrays["generation_logits"] = torch.stack(seq.recorded.generation_logits[first:]).numpy()[None, None]
        return arrays


def perf_metrics(seq) -> dict[str, np.ndarray]:
    """TensorRT-LLM's per-request perf outputs (return_perf_metrics) so far: the sequence's KV blocks (taken new,
    from the prefix cache, and in all, as TensorRT-LLM counts them: new and total alike leave the reused ones
    out), its timings on the wall clock in ns, and its drafts' acceptance."""
    now_ns, now = time.time_ns(), time.monotonic()

    def wall_ns(t: float | None) -> int:
        return 0 if t is None else now_ns - int((now - t) * 1e9)

    counts = seq.counts
    new_blocks = max(0, max(counts.held_blocks, len(seq.block_table)) - counts.reused_blocks)
    values = {
        "kv_cache_alloc_new_blocks": (new_blocks, np.int32),
        "kv_cache_reused_blocks": (counts.reused_blocks, np.int32),
        "kv_cache_alloc_total_blocks": (new_blocks, np.int32),
        "arrival_time_ns": (wall_ns(seq.timing.arrival_time), np.int64),
        "first_scheduled_time_ns": (wall_ns(seq.timing.first_scheduled_time), np.int64),
        "first_token_time_ns": (wall_ns(seq.timing.first_token_time), np.int64),
        "last_token_time_ns": (wall_ns(seq.timing.last_token_time), np.int64),
        "acceptance_rate": (counts.accepted_draft_tokens / max(1, counts.draft_tokens), np.float32),
        "total_accepted_draft_tokens": (counts.accepted_draft_tokens, np.int32),
        "total_draft_tokens": (counts.draft_tokens, np.int32),
    }
    return {name: np.array([[value]], dtype=dtype) for name, (value, dtype) in values.items()}


def _prompt_log_probs(seq) -> np.ndarray:
    """[1, prompt, 3 + 2k]: per prompt token, its id, its log-probability given the tokens before it and its rank
    among the vocabulary (1: the likeliest), then the ids and log-probabilities of the k best alternatives; the
    first token, which nothing predicts, has NaNs."""
    k, recorded = seq.params.top_log_probs, seq.recorded
    tops = recorded.prompt_top_logprobs or [([], [])] * len(recorded.prompt_logprobs)
    rows = [[seq.prompt_ids[0], *[np.nan] * (2 + 2 * k)]]
    rows += [
        [token, logprob, rank, *ids, *values]
        for token, logprob, rank, (ids, values) in zip(
            seq.prompt_ids[1:], recorded.prompt_logprobs, recorded.prompt_ranks, tops, strict=True
        )
    ]
    return np.array(rows, dtype=np.float32).reshape(1, len(rows), 3 + 2 * k)


def _reason(seq) -> bytes:
    return seq.finish_reason.value.encode() if seq.is_finished and seq.finish_reason else b""
