"""`tritonllm serve`: tritonserver on the model repository, supervised, with the HTTP shim in front of it."""

from __future__ import annotations

import argparse
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tritonllm.backend.embedding import EMBEDDING_MODEL_DIR_ENV
from tritonllm.backend.media_prompt import ALLOWED_LOCAL_MEDIA_PATH_ENV, ALLOWED_MEDIA_DOMAINS_ENV, MAX_IMAGE_PIXELS_ENV
from tritonllm.backend.model_parameters import EXCLUDE_INPUT_ENV, MODEL_DIR_ENV, TOOL_CALL_PARSER_ENV
from tritonllm.backend.reranker import RERANK_MODEL_DIR_ENV
from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.config import OVERRIDES_ENV
from tritonllm.formats.multimodal_folder import media_kinds
from tritonllm.launcher.defaults import LOOPBACK, OPTIONAL_MODELS
from tritonllm.launcher.hub_ids import resolve_hub_ids
from tritonllm.launcher.models_given import llms_of, model_formats
from tritonllm.launcher.options import engine_overrides
from tritonllm.launcher.progress import progress as _progress
from tritonllm.launcher.shim_command import import_shim, lora_registry, run_shim, shim_settings


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


class Refused(Exception):
    """A command line `serve` cannot run as given; the message says why and what to change."""


def serve(args: argparse.Namespace) -> int:
    """Checks the command line, starts tritonserver under its supervisor, then runs the shim until Ctrl-C or SIGTERM
    (with --no-shim, waits for them)."""
    from tritonllm.formats import gguf
    from tritonllm.launcher.supervisor import Supervisor
    from tritonllm.launcher.tritonserver import ServerError

    try:
        _check_flags(args)
        resolve_hub_ids(args)
        llms = llms_of(args)
        overrides = engine_overrides(args)
        loras = lora_registry(llms[0].name, args.lora_modules)
        _check_ports(args)
        _check_allocator()
    except (Refused, ValueError) as e:
        _progress(str(e))
        return 2
    # --quantized-weights false: the user asks for float32 weights, through the file dequantized into a folder
    dequantize = overrides.get("quantized_weights") == "false"
    for llm in llms:
        if gguf.is_gguf(llm.path):
            _progress(f"{llm.path.name}: {gguf.how_served(llm.path, dequantize)}")
    model_dirs = [gguf.hf_model_dir(llm.path, progress=_progress, dequantize=dequantize) for llm in llms]
    try:
        media = [media_kinds(folder) for folder in model_dirs]
    except UnsupportedModelError as e:  # a multimodal family without an encoder here
        _progress(f"cannot serve {model_dirs[0] if len(model_dirs) == 1 else 'these models'}: {e}")
        return 2
    if any(media[1:]):
        _progress("a multimodal model is served as the first (or only) --model-dir, whose encoders load beside it")
        return 2
    if len(llms) > 1:
        _progress(f"models: {', '.join(f'{llm.name} (Triton: {llm.triton.ensemble})' for llm in llms)}")
    # The shim's tool-call format (--no-shim needs none). Detecting it loads the tokenizer on a first start, seconds
    # of imports: it runs while tritonserver loads, whose preprocessing model resolves the same setting from its
    # own tokenizer the same way. The shim's own imports are done then too, off the path to ready.
    if not args.no_shim:
        early = ThreadPoolExecutor(1)
        formats = [early.submit(model_formats, args, folder) for folder in model_dirs]
        early.submit(import_shim)
    server = _triton_server(args, llms, model_dirs, overrides)
    supervisor = Supervisor(server, _progress)
    started = time.monotonic()
    _progress(
        f"starting tritonserver on {server.host} (http {args.http_port}, grpc {args.grpc_port}) for "
        + ", ".join(map(str, model_dirs[: args.models_max]))
    )
    # SIGTERM unwinds like Ctrl-C (uvicorn handles both while it runs, and re-raises them when done).
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.start(progress=lambda text: _progress(f"{text} (a first start also builds the native CPU kernels)"))
        _progress(f"tritonserver ready in {time.monotonic() - started:.1f}s")
        supervisor.start()
        if args.no_shim:
            supervisor.wait()  # until Ctrl-C or SIGTERM; a server that dies is restarted meanwhile
            return 0
        settings = _shim_settings(args, server, llms, [f.result() for f in formats], loras, model_dirs[0])
        _progress(f"shim on http://{args.host}:{args.shim_port} serving {[model.name for model in settings.llms()]}")
        run_shim(settings, args, args.shim_port, unavailable=lambda: supervisor.unavailable)
    except ServerError as e:
        _progress(str(e))
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        supervisor.close()
        _progress("stopping tritonserver")
        server.stop()
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    if args.no_embedding and args.embedding_model_dir:
        raise Refused("--no-embedding and --embedding-model-dir: pick one")
    if args.through_ensemble and args.decoupled_mode == "false" and not args.no_shim:
        raise Refused(
            "--through-ensemble streams through the ensemble, which --decoupled-mode false makes unary: pick one"
        )


def _check_ports(args: argparse.Namespace) -> None:
    """Each listener on a port of its own, free now."""
    from tritonllm.launcher.tritonserver import port_is_free

    triton_host = triton_host_of(args)
    ports = {
        "--http-port": (triton_host, args.http_port),
        "--grpc-port": (triton_host, args.grpc_port),
        "--metrics-port": (triton_host, args.metrics_port),
    }
    if not args.no_shim:
        ports["--shim-port"] = (args.host, args.shim_port)
    for flag, (host, port) in ports.items():
        same = [other for other, taken in ports.items() if other != flag and taken[1] == port]
        if same:
            raise Refused(f"port {port} is given to both {flag} and {same[0]}; each listener needs its own")
        if not port_is_free(host, port):
            raise Refused(f"port {port} on {host} ({flag}) is in use; pick another with {flag}")
    if triton_host not in LOOPBACK and not args.api_key:
        _progress(f"warning: Triton's ports listen on {triton_host} and ask for no API key (--api-key)")


def _check_allocator() -> None:
    from tritonllm.launcher import allocator

    try:
        missing = allocator.allocator_library() is None and allocator.chosen() == "tcmalloc"  # raises on a bad path
    except FileNotFoundError as e:
        raise Refused(str(e)) from e
    if missing:
        _progress(
            "warning: tcmalloc is not installed (apt-get install libtcmalloc-minimal4): Triton runs on glibc malloc"
        )


def _triton_server(args: argparse.Namespace, llms: list, model_dirs: list[Path], overrides: dict[str, str]):
    """tritonserver as the flags ask for it: its models, their settings (through the environment), its ports."""
    from tritonllm.launcher.tritonserver import TritonServer

    several = len(llms) > 1
    side_models = [*(() if args.no_embedding else ("embedding",)), *(("reranker",) if args.rerank_model_dir else ())]
    env = {
        TOOL_CALL_PARSER_ENV: args.tool_call_parser,
        OVERRIDES_ENV: json.dumps(overrides),
        EXCLUDE_INPUT_ENV: args.exclude_input_in_output,
        # several: each model's folder is in its config, and an exported $TRITONLLM_MODEL_DIR must not override it
        MODEL_DIR_ENV: "" if several else str(model_dirs[0]),
    }
    if args.allowed_local_media_path:
        env[ALLOWED_LOCAL_MEDIA_PATH_ENV] = str(Path(args.allowed_local_media_path.removeprefix("file://")).resolve())
    if args.allowed_media_domains:
        env[ALLOWED_MEDIA_DOMAINS_ENV] = ",".join(args.allowed_media_domains)
    env[MAX_IMAGE_PIXELS_ENV] = str(args.max_image_pixels)
    if args.rerank_model_dir:
        env[RERANK_MODEL_DIR_ENV] = str(Path(args.rerank_model_dir).absolute())
    if args.embedding_model_dir:
        env[EMBEDDING_MODEL_DIR_ENV] = str(Path(args.embedding_model_dir).resolve())
    return TritonServer(
        Path(args.model_repository),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        host=triton_host_of(args),
        api_key=args.api_key,
        llm_instances=args.llm_instances,
        decoupled=args.decoupled_mode == "true",
        without_models=("embedding",) if args.no_embedding else (),
        extra_models=(
            *((OPTIONAL_MODELS / "reranker",) if args.rerank_model_dir else ()),
            *((OPTIONAL_MODELS / "multimodal_encoders",) if media_kinds(model_dirs[0]) else ()),
        ),
        exit_timeout_s=args.drain_seconds,
        traces_endpoint=args.otlp_traces_endpoint,
        # several LLMs: each one's folder is written into its staged configs, and the models load on demand
        llms=[(llm.triton, folder) for llm, folder in zip(llms, model_dirs, strict=True)] if several else [],
        load_at_start=(*[llm.triton.ensemble for llm in llms[: args.models_max]], *side_models) if several else None,
        env=env,
    )


def _shim_settings(
    args: argparse.Namespace, server, llms: list, formats: list[tuple[str, str]], loras, first_dir: Path
):
    """The shim's settings for the LLMs `serve` started, each with the formats detected from its chat template."""
    from tritonllm.shim.settings import ServedModel

    served = [ServedModel(llm.name, llm.triton, *found) for llm, found in zip(llms, formats, strict=True)]
    media = tuple(sorted(media_kinds(first_dir)))
    if media:
        _progress(f"{served[0].name}: prompts take {', '.join(media)} beside text (a shim of its own: --media)")
    for model in served:
        _progress(
            f"{model.name}: tool calls in the {model.tool_call_parser} format; "
            f"reasoning parser: {model.reasoning_parser}"
        )
    first = served[0]
    return shim_settings(
        args,
        triton_grpc_url=server.grpc_url,
        served_model_name=first.name,
        embedding_model_name=None if args.no_embedding else args.embedding_model_name,
        rerank_model_name=rerank_name(args),
        tool_call_parser=first.tool_call_parser,
        reasoning_parser=first.reasoning_parser,
        media=media,
        loras=loras,
        more_models=tuple(served[1:]),
        models_max=args.models_max,
    )


def rerank_name(args: argparse.Namespace) -> str | None:
    """The reranker's name in /v1/rerank and /v1/score: --rerank-model-name, else its folder's; None without one."""
    if args.rerank_model_name:
        return args.rerank_model_name
    return Path(args.rerank_model_dir).name if args.rerank_model_dir else None


def triton_host_of(args: argparse.Namespace) -> str:
    """Where Triton's ports listen: --triton-host; else, beside the shim, loopback (the shim is the door and
    Triton's ports would be one past its key), and with --no-shim, --host (Triton is then what is served)."""
    if args.triton_host:
        return args.triton_host
    return args.host if args.no_shim else "127.0.0.1"
