"""A model that fails to load stops the server with the model's own error, not a timeout."""

from __future__ import annotations

import shutil

import pytest
from conftest import REPOSITORY

from tritonllm.runtime.model_config import MODEL_DIR_ENV
from tritonllm.runtime.tritonserver import ServerError, TritonServer, free_port


def test_a_bad_setting_fails_the_start_naming_the_model_and_the_setting(tiny_model_dir, tmp_path):
    repository = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "llm", repository / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    config = repository / "llm" / "config.pbtxt"
    config.write_text(
        config.read_text().replace(
            '"max_num_seqs" value: { string_value: "64" }', '"max_num_seqs" value: { string_value: "0" }'
        )
    )
    server = TritonServer(
        repository,
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        env={MODEL_DIR_ENV: str(tiny_model_dir)},
        log_file=tmp_path / "tritonserver.log",
    )
    with pytest.raises(ServerError, match=r"(?s)llm: .*max_num_seqs: 0 is not allowed"):
        server.start(timeout=300)
    server.stop()
