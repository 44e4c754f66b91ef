"""A model that fails to load stops the server with the model's own error, not a timeout."""

from __future__ import annotations

import shutil

import pytest
from conftest import REPOSITORY, launch_triton

from tritonllm.runtime.tritonserver import ServerError


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
