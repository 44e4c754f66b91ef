"""The LLMs a command is given (--model-dir, --models-folder, the environment, the default), named and checked
as model_set names them, and the formats their chat templates write tool calls and thinking in."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tritonllm.backend.model_parameters import MODEL_DIR_ENV
from tritonllm.launcher.defaults import DEFAULT_MODEL, DEFAULT_MODELS
from tritonllm.launcher.progress import progress as _progress
from tritonllm.tokenizer import reasoning
from tritonllm.tokenizer.tool_calls import resolve_format_of


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
