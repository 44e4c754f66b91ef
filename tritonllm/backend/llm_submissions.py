"""A Triton request to the llm read into the engine's submissions: each row's prompt and SamplingParams, its
samples or beams as Sequences (with their LoRA adapter, grammar, drafts and deadline), and the Responders that
answer them on the request's sender, or on the multiplexed channel the request names."""

from __future__ import annotations

import time
from functools import cached_property
from pathlib import Path

from tritonllm.backend import llm_spans
from tritonllm.backend.llm_metrics import EngineMetrics
from tritonllm.backend.llm_responses import Channel, Responder, ResponseQueue, SampleGroup
from tritonllm.backend.open_channels import OpenChannels
from tritonllm.backend.stream_interval import StreamInterval
from tritonllm.common.errors import RequestError
from tritonllm.engine.decoding.grammar import GrammarCompiler
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.engine_thread import Submission
from tritonllm.engine.layers import lora
from tritonllm.engine.layers.lora import AdapterCache
from tritonllm.engine.state import inference_request
from tritonllm.engine.state.sequence import Speculation, samples_of
from tritonllm.formats.hf_folder import load_tokenizer
from tritonllm.wire import multiplex


class SubmissionReader:
    """Reads requests for one engine. `channels`: the multiplexed channels this instance holds."""

    def __init__(
        self,
        engine: LLMEngine,
        model_dir: Path,
        adapters: AdapterCache,
        responses: ResponseQueue,
        metrics: EngineMetrics,
        stream_interval: int,
        channels: OpenChannels,
    ) -> None:
        self.engine = engine
        self.model_dir = model_dir
        self.adapters = adapters
        self.responses = responses
        self.metrics = metrics
        self.stream_interval = stream_interval
        self.channels = channels
        self.hidden_size = engine.runner.model.config.hidden_size

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Built at the first guided request, as vLLM builds its grammar backend: a second of tokenizer work that
        a start without one need not wait for."""
        return GrammarCompiler(load_tokenizer(self.model_dir))

    def submissions(self, request, sender, rows: list[dict]) -> list[Submission]:
        """The engine's sequences of a request's rows (TensorRT-LLM's batch: each answered with its batch_index),
        every one of them checked before any is submitted. Triton's FINAL flag goes on the response of the last
        sample of the last row to finish."""
        generations = [self._parse(row.get, request) for row in rows]
        group = SampleGroup(sum(len(samples) for _, samples, _ in generations))
        mux = None  # a batch's rows are answered on their request
        if len(rows) == 1:
            parsed, _, beams = generations[0]
            mux = self._multiplexed(rows[0].get, request.request_id(), parsed.params, beams or parsed.draft_tokens)
        wanted = frozenset(request.requested_output_names())
        channel = Channel(sender, wanted, self.responses, llm_spans.on_finished(self.metrics.finished, request), mux)
        submissions = []
        for index, (parsed, samples, beams) in enumerate(generations):
            interval, batch_index = parsed.stream_interval or self.stream_interval, index if len(rows) > 1 else None
            responders = [
                Responder(channel, parsed, group, StreamInterval(interval), beams, batch_index) for _ in samples
            ]
            submissions += [Submission(seq, r, sender.is_cancelled) for seq, r in zip(samples, responders, strict=True)]
        return submissions

    def _parse(self, get, request) -> tuple[inference_request.ParsedRequest, list, int]:
        """One prompt's request, its engine sequences, and how many best beams it returns (0: no beam search)."""
        parsed = inference_request.parse(get, self.engine.runner.shape.vocab_size, request.timeout(), self.hidden_size)
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
            rope_positions=parsed.rope_positions,
            adapter=self._adapter(get),
            speculation=Speculation(parsed.draft_tokens, parsed.draft_logits, prediction=parsed.prediction),
            deadline=None if parsed.timeout_s is None else time.monotonic() + parsed.timeout_s,
        )
        if parsed.guide is not None:
            for seq in samples:
                seq.grammar = self.grammars.matcher(*parsed.guide)
        return parsed, samples, beams

    def _multiplexed(self, get, request_id: str, params, more_than_tokens) -> tuple[object, str] | None:
        """The channel the request names, where this instance holds it and the request's responses fit its rows
        (tokens only: no log-probs, logits, beams or draft counts); else None, and it is answered on its own."""
        name = inference_request.scalar(get, multiplex.CHANNEL)
        if not isinstance(name, bytes) or more_than_tokens or params.return_log_probs or params.top_log_probs:
            return None
        if params.wants_prompt_logits or params.return_generation_logits or params.return_prompt_ids:
            return None
        channel = self.channels.live(name.decode())
        return None if channel is None else (channel, request_id)

    def _adapter(self, get):
        task_id = inference_request.scalar(get, "lora_task_id")
        weights, config = get("lora_weights"), get("lora_config")
        if task_id is None:
            if weights is not None or config is not None:
                raise RequestError("lora_task_id", "lora_weights and lora_config need a lora_task_id")
            return None
        if self.engine.runner.lora is None:
            raise RequestError("lora_task_id", lora.UNAVAILABLE)
        return lora.resolve(self.adapters, int(task_id), weights, config, self.engine.runner.model)
