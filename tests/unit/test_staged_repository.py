"""`serve --llm-instances N` runs a staged copy of the model repository made of links: its llm config carries
the count, and every model still finds relative paths from the folder that holds the real repository."""

from __future__ import annotations

import json
import shutil

from conftest import PROJECT_ROOT, REPOSITORY

from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.launcher.tritonserver import stage_repository


def args(model_folder) -> dict:
    """What Triton's Python backend hands a model's initialize() (the keys ModelParameters reads)."""
    return {"model_config": json.dumps({"parameters": {}}), "model_repository": str(model_folder), "model_version": "1"}


def test_a_staged_repository_sets_the_count_and_keeps_relative_paths():
    staged = stage_repository(REPOSITORY, 3)
    try:
        assert "instance_group [ { count: 3, kind: KIND_AUTO } ]" in (staged / "llm" / "config.pbtxt").read_text()
        assert (staged / "llm" / "1").resolve() == REPOSITORY / "llm" / "1"
        for model in ("llm", "preprocessing", "embedding"):  # the llm's folder is real, the others are links
            assert ModelParameters(args(staged / model)).path("models/x") == PROJECT_ROOT / "models" / "x"
        assert ModelParameters(args(REPOSITORY / "llm")).path("models/x") == PROJECT_ROOT / "models" / "x"
    finally:
        shutil.rmtree(staged)


def test_a_staged_repository_leaves_out_the_models_not_served():
    staged = stage_repository(REPOSITORY, 1, without=("embedding",))
    try:
        assert sorted(p.name for p in staged.iterdir()) == sorted(
            p.name for p in REPOSITORY.iterdir() if p.name != "embedding"
        )
        assert (staged / "llm").resolve() == REPOSITORY / "llm"  # one instance: the llm's folder is a link
    finally:
        shutil.rmtree(staged)
