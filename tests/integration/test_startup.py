"""Starting the server: a model that fails to load stops it with the model's own error, not a timeout; a first
start with nothing cached."""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest
from conftest import REPOSITORY, launch_triton

from tritonllm.formats import model_cache
from tritonllm.launcher.tritonserver import ServerError


def test_a_bad_setting_fails_the_start_naming_the_model_and_the_setting(tiny_model_dir, tmp_path):
    repository = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "llm", repository / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    config = repository / "llm" / "config.pbtxt"
    config.write_text(
        config.read_text().replace(
            '"max_num_seqs" value: { string_value: "64" }', '"max_num_seqs" value: { string_value: "0" }'
        )
    )
    with pytest.raises(ServerError, match=r"(?s)llm: .*max_num_seqs: 0 is not allowed"):
        launch_triton(tiny_model_dir, tmp_path, repository)  # which stops what the failed server started


def test_a_first_start_builds_the_llama_model_without_transformers_in_each_instance(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Nothing cached: each llm instance has transformers' reference computed in a process of its own (in the
    stub's C locale), both at once, and serves the model built without transformers."""
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    server = launch_triton(tiny_model_dir, tmp_path, llm_instances=2)
    try:
        body = json.dumps({"text_input": "Hello", "max_tokens": 4}).encode()
        url = f"{server.http_url}/v2/models/ensemble/generate"
        with urllib.request.urlopen(urllib.request.Request(url, body), timeout=60) as response:
            assert json.loads(response.read())["text_output"]
    finally:
        server.stop()
    log = (tmp_path / "tritonserver.log").read_text()
    assert log.count("model built without transformers") == 2, log[-3000:]
    assert list((tmp_path / "cache").glob("*.reference_logits.pt"))
