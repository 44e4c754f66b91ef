"""schemathesis on the shim's own /openapi.json: whatever a request body the schema allows, no 5xx.

The model is the tiny demo with its context cut to 96 tokens, so every generation the fuzzer asks for ends within
96 tokens (a larger max_tokens is a 400), which bounds the run; the examples per route are bounded too.
"""

from __future__ import annotations

import json

import pytest

from .conftest import MODEL, run_tool, triton_and_shim

CONTEXT = 96


@pytest.fixture(scope="module")
def short_context_shim(tiny_model_dir, tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny-short") / MODEL
    model.mkdir()
    for item in tiny_model_dir.iterdir():
        (model / item.name).symlink_to(item)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    (model / "config.json").unlink()
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    with triton_and_shim(model, tmp_path_factory.mktemp("triton-fuzz"), MODEL, "hermes") as url:
        yield url


@pytest.mark.slow
def test_no_request_the_schema_allows_gets_a_5xx(short_context_shim, tmp_path):
    args = ["run", f"{short_context_shim}/openapi.json", "--checks", "not_a_server_error"]
    args += ["--max-examples", "25", "--seed", "1", "--workers", "1", "--request-timeout", "60", "--max-time", "480"]
    run_tool("schemathesis", args, cwd=tmp_path, timeout=1200)
