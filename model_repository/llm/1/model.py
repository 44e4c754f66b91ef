"""Triton adapter of the engine: InferenceRequest tensors in, streamed token responses out.

`execute()` only validates and hands requests to the engine thread; responses are sent from that thread.
A request with `stop` set cancels the live requests that carry the same Triton request id, which is how
clients of the ensemble (into whose steps Triton forwards no cancellation) end a generation early. With several
instances the stop may reach one that does not run the generation, so it is passed on to the others
(tritonllm/backend/stop_board.py). A client that runs many generations at once may have their responses multiplexed
onto one channel of its own (tritonllm/wire/multiplex.py).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import logging
import time
from functools import cached_property

import torch
import triton_python_backend_utils as pb_utils

from tritonllm.backend import llm_spans
from tritonllm.backend.llm_metrics import EngineMetrics
from tritonllm.backend.llm_responses import FINAL, Channel, Responder, ResponseQueue, SampleGroup
from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.backend.stop_board import StopBoard, server_folder
from tritonllm.backend.stream_interval import StreamInterval
from tritonllm.common import errors, tracing
from tritonllm.common.errors import RequestError
from tritonllm.common.memory import release_free_memory
from tritonllm.common.request_parameters import batch_rows
from tritonllm.engine import inference_request, lora, tensor_parallel
from tritonllm.engine.config import EngineConfig, environment_overrides
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.engine_thread import EngineThread, Submission, load_on_own_thread
from tritonllm.engine.grammar import GrammarCompiler
from tritonllm.engine.lora import AdapterCache
from tritonllm.engine.sequence import Speculation, samples_of
from tritonllm.formats import gguf
from tritonllm.formats.hf_folder import load_tokenizer
from tritonllm.formats.multimodal_folder import language_model_dir
from tritonllm.wire import multiplex

log = logging.getLogger("tritonllm.llm")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        faulthandler.enable()  # a crash of the engine's process leaves every thread's Python stack in Triton's log
        params = ModelParameters(args)
        model_dir = language_model_dir(params.model_dir())  # a multimodal model's: its language model alone
        source = gguf.source_file(model_dir)
        values = {**params.values(), **environment_overrides()}
        config = EngineConfig.from_parameters(str(model_dir), values, gguf_file=str(source) if source else None)
        if args.get("model_instance_kind") == "GPU" and config.device == "auto":
            config = dataclasses.replace(config, device=f"cuda:{args['model_instance_device_id']}")
        if params.instance_count > 1:  # each instance is a process with a forward pass of its own
            torch.set_num_threads(tensor_parallel.cores_per(params.instance_count))
        self.model_dir = model_dir
        self.engine = load_on_own_thread(lambda: LLMEngine(config))
        blocks, runner = self.engine.blocks, self.engine.runner
        pb_utils.Logger.log_info(
            f"{args['model_instance_name']}: KV cache of {blocks.num_blocks * blocks.block_size} tokens "
            f"({blocks.num_blocks} blocks of {blocks.block_size}), {self.engine.kv_cache_bytes / 2**20:.0f} MiB; "
            f"model built {'through' if runner.transformers else 'without'} transformers; "
            f"{runner.quantized_layers} linear layers on GGUF blocks; "
            f"decode steps on the {'native decoder stack' if runner.decoder_stack else 'modules'}; "
            f"speculative decoding: {config.speculative}"
        )
        self.hidden_size = self.engine.runner.model.config.hidden_size
        self.shared = server_folder(args["model_name"])
        self.adapters = AdapterCache(config.lora_cache_size, self.shared / "lora")
        self.stream_interval = config.stream_interval
        self.metrics = EngineMetrics(args["model_instance_name"])
        self.metrics.update(self.engine)  # the pool's size, before any step
        self.responses = ResponseQueue()
        self.channels: dict[str, object] = {}  # multiplexed channels by their opening request's id: its sender
        self.thread = EngineThread(
            self.engine,
            on_step=self.metrics.update,
            max_queue_size=config.max_queue_size,
            max_queue_wait=config.max_queue_wait,
            nice=config.engine_nice,
        )
        # What is loaded now (the model's modules, the tokenizer: some 400,000 objects) lives as long as the
        # process. Frozen, the collector's rare full passes leave it out: one took 157 ms with it, longer than a
        # decode step of 32 sequences, a stall of every stream (vLLM freezes after loading too).
        gc.collect()
        gc.freeze()
        release_free_memory()
        self.thread.start()
        self.stops = StopBoard(self.shared / "stops", args["model_instance_name"], self.thread.cancel)

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Built at the first guided request, as vLLM builds its grammar backend: a second of tokenizer work that
        a start without one need not wait for."""
        return GrammarCompiler(load_tokenizer(self.model_dir))

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            get = inputs.get
            try:
                if inference_request.is_stop_request(get):
                    channel = self.channels.pop(request.request_id(), None)
                    if channel is not None:  # a multiplexed channel's client closes it
                        channel.send(flags=FINAL)
                    self.thread.cancel(request.request_id())
                    self.stops.tell(request.request_id())
                    sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
                    continue
                pause = inference_request.pause_request(get)
                if pause is not None:
                    self.thread.pause(pause)
                    sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
                    continue
                if inference_request.scalar(get, multiplex.OPEN, False):
                    self.channels[request.request_id()] = sender
                    sender.send(pb_utils.InferenceResponse(output_tensors=[]))  # open: generations may name it
                    continue
                self.thread.submit(self._submissions(request, sender, batch_rows(inputs)))
            except Exception as e:  # a RequestError is the request's fault; anything else a bug, logged
                message = errors.to_message(e, request.request_id(), log)
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)
        return None

    def _submissions(self, request, sender, rows: list[dict]) -> list[Submission]:
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
        channel = self.channels.get(name.decode()) if isinstance(name, bytes) else None
        if channel is None or more_than_tokens or params.return_log_probs or params.top_log_probs:
            return None
        if params.wants_prompt_logits or params.return_generation_logits or params.return_prompt_ids:
            return None
        if channel.is_cancelled():  # its client has gone
            del self.channels[name.decode()]
            return None
        return channel, request_id

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

    def finalize(self) -> None:
        self.stops.close()
        self.adapters.close()
        for folder in (self.shared / "stops", self.shared / "lora", self.shared):
            try:
                folder.rmdir()  # the last instance to stop removes the server's folder
            except OSError:
                pass
        self.thread.shutdown()
        self.responses.close()
        for channel in self.channels.values():
            channel.send(flags=FINAL)
        self.metrics.close()
        tracing.flush(llm_spans.SERVICE)
