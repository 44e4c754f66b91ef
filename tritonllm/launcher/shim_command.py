"""`tritonllm shim`: the HTTP shim alone, in front of a tritonserver that runs elsewhere; and the shim's settings
and its run, which `serve` shares."""

from __future__ import annotations

import argparse
import os

from tritonllm.common.tracing import OTLP_TRACES_ENDPOINT_ENV
from tritonllm.launcher.defaults import DEFAULT_MODEL, LOOPBACK
from tritonllm.launcher.hub_ids import resolve_hub_ids
from tritonllm.launcher.models_given import llms_of, model_formats
from tritonllm.launcher.progress import progress as _progress


def shim(args: argparse.Namespace) -> int:
    """Only the HTTP shim, in front of a tritonserver that runs elsewhere (e.g. the official container)."""

    try:  # the settings load the LoRA adapters: a bad one stops the shim before it serves
        resolve_hub_ids(args)
        served = shim_models(args)
        settings = shim_settings(
            args,
            triton_grpc_url=args.triton_grpc_url,
            served_model_name=served[0].name,
            embedding_model_name=args.embedding_model_name,
            rerank_model_name=args.rerank_model_name,
            tool_call_parser=served[0].tool_call_parser,
            reasoning_parser=served[0].reasoning_parser,
            media=tuple(args.media),
            more_models=tuple(served[1:]),
            models_max=args.models_max,
        )
    except ValueError as e:
        _progress(str(e))
        return 2
    _progress(f"shim on http://{args.host}:{args.port} -> triton {args.triton_grpc_url}")
    run_shim(settings, args, args.port)
    return 0


def shim_models(args: argparse.Namespace) -> list:
    """The shim's LLMs: with --model-dir / --models-folder, those `serve` was given (each one's formats from its
    folder; a .gguf file's from the flags, as its tokenizer lives in the serving side's cache); else the one
    named --served-model-name."""
    from tritonllm.formats import gguf
    from tritonllm.shim.settings import ServedModel
    from tritonllm.wire.triton_names import REPOSITORY_NAMES

    flags = (args.tool_call_parser, args.reasoning_parser)
    if not args.model_dir and not args.models_folder:
        return [ServedModel(args.served_model_name or DEFAULT_MODEL, REPOSITORY_NAMES, *flags)]
    detect = argparse.Namespace(tool_call_parser="auto", reasoning_parser="auto")
    return [
        ServedModel(llm.name, llm.triton, *(flags if gguf.is_gguf(llm.path) else model_formats(detect, llm.path)))
        for llm in llms_of(args)
    ]


def lora_registry(served_model_name: str, modules: list[str]):
    """The --lora-modules adapters, loaded once, before anything starts (a bad one stops serve then); None
    without any, so that serve's start does not wait for the shim's imports."""
    if not modules:
        return None
    from tritonllm.shim.lora_registry import LoraRegistry

    return LoraRegistry(served_model_name, modules)


def shim_settings(args: argparse.Namespace, **where):
    """The shim's settings from the flags `serve` and `shim` share, and `where` the model is and how it is named.
    --otlp-traces-endpoint reaches the shim as it reaches the models' processes, through the environment."""
    from tritonllm.shim.settings import ShimSettings

    if args.otlp_traces_endpoint:
        os.environ[OTLP_TRACES_ENDPOINT_ENV] = args.otlp_traces_endpoint

    return ShimSettings(
        default_max_tokens=args.default_max_tokens,
        full_text_enabled=args.full_text,
        reasoning_budget=args.reasoning_budget,
        guide_reasoning=args.guide_reasoning,
        trust_request_chat_template=args.trust_request_chat_template,
        strict_request_fields=args.strict_request_fields,
        api_key=args.api_key,
        batch_dir=args.batch_dir,
        through_ensemble=args.through_ensemble,
        lora_modules=tuple(args.lora_modules),
        allow_runtime_lora=args.allow_runtime_lora,
        **where,
    )


def import_shim() -> None:
    import uvicorn  # noqa: F401

    from tritonllm.shim import app  # noqa: F401


def run_shim(settings, args: argparse.Namespace, port: int, unavailable=None) -> None:
    """`unavailable`: says why the Triton behind the shim cannot serve right now (None while it can)."""
    import uvicorn

    from tritonllm.shim.app import create_app

    if not settings.api_key and args.host not in LOOPBACK:
        _progress(f"warning: the shim listens on {args.host} and asks for no API key (--api-key)")
    uvicorn.run(
        create_app(settings, unavailable),
        host=args.host,
        port=port,
        log_level="warning",
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        timeout_graceful_shutdown=args.drain_seconds,
    )
