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

import torch
import triton_python_backend_utils as pb_utils

from tritonllm.backend import llm_spans, stub_exit
from tritonllm.backend.llm_metrics import EngineMetrics
from tritonllm.backend.llm_responses import FINAL, ResponseQueue
from tritonllm.backend.llm_submissions import SubmissionReader
from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.backend.open_channels import OpenChannels
from tritonllm.backend.stop_board import StopBoard, server_folder
from tritonllm.backend.unload_watch import UnloadWatch
from tritonllm.common import errors, tracing
from tritonllm.common.memory import release_free_memory
from tritonllm.common.request_parameters import batch_rows
from tritonllm.engine.config import EngineConfig, environment_overrides
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.engine_thread import EngineThread, load_on_own_thread
from tritonllm.engine.layers.lora import AdapterCache
from tritonllm.engine.parallel import tensor_parallel
from tritonllm.engine.state import inference_request
from tritonllm.formats import gguf
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
        self.shared = server_folder(args["model_name"])
        self.adapters = AdapterCache(config.lora_cache_size, self.shared / "lora")
        self.metrics = EngineMetrics(args["model_instance_name"])
        self.metrics.update(self.engine)  # the pool's size, before any step
        self.responses = ResponseQueue()
        self.channels = OpenChannels(self.responses)
        self.reader = SubmissionReader(
            self.engine, model_dir, self.adapters, self.responses, self.metrics, config.stream_interval, self.channels
        )
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
        self.unload_watch = UnloadWatch(args["model_name"], args["model_version"], self._unloading)

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            get = inputs.get
            try:
                if inference_request.is_stop_request(get):
                    self.channels.close(request.request_id())  # a multiplexed channel's client closes it
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
                    self.channels.open(request.request_id(), sender)
                    sender.send(pb_utils.InferenceResponse(output_tensors=[]))  # open: generations may name it
                    continue
                self.thread.submit(self.reader.submissions(request, sender, batch_rows(inputs)))
            except Exception as e:  # a RequestError is the request's fault; anything else a bug, logged
                message = errors.to_message(e, request.request_id(), log)
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)
        return None

    def _unloading(self, deadline: float) -> None:
        """Triton stops the model: the generations running may finish until `deadline`, then end (cancelled); the
        channels close after them, so that every request is released and the model unloads (unload_watch.py)."""
        while self.thread.num_live() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.thread.end_all(then=self.channels.close_all)

    def finalize(self) -> None:
        """Every request has had its final response (Triton unloads only then): nothing is sent from here on, as
        Triton's Python backend no longer delivers responses."""
        self.unload_watch.close()
        self.channels.stop()
        self.stops.close()
        self.adapters.close()
        for folder in (self.shared / "stops", self.shared / "lora", self.shared):
            try:
                folder.rmdir()  # the last instance to stop removes the server's folder
            except OSError:
                pass
        self.thread.shutdown()
        self.responses.close()
        self.metrics.close()
        tracing.flush(llm_spans.SERVICE)
        stub_exit.release(self)
