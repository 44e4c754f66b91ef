"""The command line's option groups, each declared once for the commands that take it."""

from __future__ import annotations

import argparse
import os

from tritonllm.engine.config import EngineConfig, kind_of
from tritonllm.launcher.defaults import API_KEY_ENV, THROUGH_ENSEMBLE_ENV
from tritonllm.media.kinds import MAX_IMAGE_PIXELS
from tritonllm.shim.batch_store import DEFAULT_BATCH_DIR
from tritonllm.tokenizer import reasoning
from tritonllm.tokenizer.tool_calls import FORMATS


def add_shim_options(p: argparse.ArgumentParser, *, beside_triton: bool) -> None:
    """The options `serve` and `shim` share for the shim. `beside_triton`: serve's, which detects the model's
    formats from its chat template; `shim` is told them, as `serve` prints them."""
    p.add_argument("--embedding-model-name", default="all-MiniLM-L6-v2", help="the name /v1/embeddings answers to")
    p.add_argument(
        "--rerank-model-name",
        help="the name /v1/rerank answers to (default: the folder's)"
        if beside_triton
        else "the reranker tritonserver serves, by the name /v1/rerank answers to",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="where the shim listens" + (" (with --no-shim: Triton)" if beside_triton else ""),
    )
    p.add_argument("--default-max-tokens", type=int, default=256, help="for requests without max_tokens")
    p.add_argument("--full-text", action="store_true", help="stream the whole text so far in every event")
    if beside_triton:
        tool_calls = {
            "default": "auto",
            "choices": ["auto", *FORMATS],
            "help": "how the model writes tool calls (default: detected from its chat template)",
        }
        thinking = {
            "default": "auto",
            "choices": ["auto", reasoning.NONE, *reasoning.FORMATS],
            "help": "how the "
            "model's thinking is told from its answer (reasoning_content): detected from its chat template "
            "by default; none: all of it is content",
        }
    else:
        tool_calls = {
            "default": "json",
            "choices": list(FORMATS),
            "help": "how the model writes tool calls; must match Triton's (`serve` prints the one it detects)",
        }
        thinking = {
            "default": reasoning.NONE,
            "choices": [reasoning.NONE, *reasoning.FORMATS],
            "help": "how the model's thinking is told from its answer (`serve` prints the one it detects)",
        }
    p.add_argument("--tool-call-parser", **tool_calls)
    p.add_argument("--reasoning-parser", **thinking)
    if not beside_triton:
        p.add_argument(
            "--media",
            nargs="*",
            choices=["image", "video", "audio"],
            default=[],
            help="what the (first) model's prompts may carry beside text; must match Triton's (`serve` reads it "
            "from the model)",
        )


def add_model_set_options(p: argparse.ArgumentParser, model_dir_help: str) -> None:
    p.add_argument("--model-dir", action="append", help=model_dir_help)
    p.add_argument(
        "--revision",
        help="the branch, tag or commit of the LLMs given as hub ids (default: main); $HF_HUB_OFFLINE, "
        "$HF_HUB_CACHE / $HF_HOME and $HF_TOKEN as huggingface_hub reads them",
    )
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


def add_media_options(p: argparse.ArgumentParser) -> None:
    """Where a multimodal model's media may come from (vLLM's flags of the same names)."""
    p.add_argument(
        "--allowed-local-media-path",
        default="",
        help="the one server folder whose files a request's media parts may name (a path or file:// URL); "
        "without it a server path is refused",
    )
    p.add_argument(
        "--allowed-media-domains",
        nargs="*",
        default=[],
        help="the only hosts a media URL (and each of its redirects) may name (default: any)",
    )
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=MAX_IMAGE_PIXELS,
        metavar="N",
        help="an image's width x height at most, read from its header before it is decoded; a larger one is a 400 "
        "naming its part (default: an 8K frame, %(default)s)",
    )


def add_access_options(p: argparse.ArgumentParser) -> None:
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
        help=f"require the key (`Authorization: Bearer KEY`, or `x-api-key`) on every shim route but /health "
        f"(default: ${API_KEY_ENV})",
    )
    p.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="export OpenTelemetry traces over OTLP/HTTP to URL (as http://127.0.0.1:4318/v1/traces): a span per "
        "request in the shim continuing the client's traceparent, Triton's own, and the llm's queue, prefill and "
        "decode (default: none)",
    )
    p.add_argument(
        "--batch-dir",
        default=str(DEFAULT_BATCH_DIR),
        help="where the Batch API keeps its files, jobs and their progress (SQLite), so that a job outlives a "
        "restart (default: %(default)s)",
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


def add_engine_options(p: argparse.ArgumentParser) -> None:
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
