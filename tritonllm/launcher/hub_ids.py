"""Hub ids wherever `serve` and `shim` name a model: each is resolved to its local folder or .gguf file (see
formats/hub_model.py) before anything else reads the flags, so the rest of the launcher sees paths only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tritonllm.formats import hub_model
from tritonllm.launcher.defaults import DEFAULT_MODELS

# The flags that name one folder model each (the speculative model is the engine's --speculative-model).
FOLDER_FLAGS = ("engine_speculative_model", "embedding_model_dir", "rerank_model_dir")


def resolve_hub_ids(args: argparse.Namespace) -> None:
    """Rewrites every hub id among the flags into its local path; the first LLM given by hub id is served by that
    id unless --served-model-name says otherwise (vLLM's default). --revision applies to the LLMs. Raises
    HubModelError (a ValueError) for an id that cannot be had."""
    given = list(getattr(args, "model_dir", None) or ())
    if given and is_hub_id(given[0]) and not getattr(args, "served_model_name", None):
        args.served_model_name = given[0]
    revision = getattr(args, "revision", None)
    args.model_dir = [_local(name, revision) for name in given] or None
    reranker = getattr(args, "rerank_model_dir", None)
    if reranker and is_hub_id(reranker) and not getattr(args, "rerank_model_name", None):
        args.rerank_model_name = reranker  # answered by its id, as the LLM is
    for flag in FOLDER_FLAGS:
        name = getattr(args, flag, None)
        if name:
            setattr(args, flag, _local(name))
    if getattr(args, "lora_modules", None):
        args.lora_modules = [_local_adapter(spec) for spec in args.lora_modules]


def is_hub_id(name: str) -> bool:
    """A hub id, and not a demo model of the checkout's models/ that `serve` builds when it is missing."""
    return hub_model.is_hub_id(name) and Path(name).absolute().parent != DEFAULT_MODELS.absolute()


def _local(name: str, revision: str | None = None) -> str:
    return str(hub_model.resolve(name, revision)) if is_hub_id(name) else name


def _local_adapter(spec: str) -> str:
    """A --lora-modules entry (`name=path` or vLLM's JSON form) with a hub id path made local."""
    if spec.lstrip().startswith("{"):
        given = json.loads(spec)
        if isinstance(given, dict) and isinstance(given.get("path"), str):
            return json.dumps({**given, "path": _local(given["path"])})
        return spec
    name, sep, path = spec.partition("=")
    return f"{name}{sep}{_local(path)}" if sep and path else spec
