"""The shim's direct route as read from the ensemble's config (the served answers: tests/e2e/test_direct_route.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PROJECT_ROOT
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonllm.shim.direct_route import DirectRoute
from tritonllm.tokenizer.backend_tokenizer import cached_snapshot, load_backend_tokenizer

ENSEMBLE_CONFIG = PROJECT_ROOT / "model_repository" / "ensemble" / "config.pbtxt"


def _config() -> model_config_pb2.ModelConfig:
    return text_format.Parse(ENSEMBLE_CONFIG.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def snapshot(tiny_model_dir) -> str:
    load_backend_tokenizer(tiny_model_dir)  # writes the snapshot on a first start
    text = cached_snapshot(tiny_model_dir)
    assert text
    return text


def test_the_repositorys_ensemble_maps_each_step(snapshot):
    route = DirectRoute.of(_config(), snapshot)
    assert route is not None
    one = np.array([[1]], dtype=np.int32)
    tensors = [("text_input", "BYTES", np.array([[b"hi"]], dtype=object)), ("stream", "BOOL", np.array([[True]]))]
    tensors.append(("top_k", "INT32", one))
    assert [name for name, _, _ in route.preprocessing_request(tensors)] == ["text_input"]
    preprocessed = [("input_ids", "INT32", one), ("request_output_len", "INT32", one)]
    llm = {name: dt for name, dt, _ in route.llm_request(tensors, preprocessed)}
    # the ensemble's names become the llm's (stream -> streaming, top_k -> runtime_top_k)
    assert llm == {"input_ids": "INT32", "request_output_len": "INT32", "streaming": "BOOL", "runtime_top_k": "INT32"}


def test_an_ensemble_of_other_steps_goes_through_the_ensemble(snapshot):
    config = _config()
    del config.ensemble_scheduling.step[2]  # no postprocessing: the shim cannot stand in for what is not there
    assert DirectRoute.of(config, snapshot) is None

    config = _config()
    config.ensemble_scheduling.step[2].model_name = "my_postprocessing"
    assert DirectRoute.of(config, snapshot) is None

    config = _config()
    post = config.ensemble_scheduling.step[2]
    post.input_map["output_ids"] = "_output_log_probs"  # postprocessing reads another llm output under this name
    assert DirectRoute.of(config, snapshot) is None

    config = _config()
    config.ensemble_scheduling.step[2].output_map["text_output"] = "renamed_text"
    assert DirectRoute.of(config, snapshot) is None


def test_a_tokenizer_without_a_snapshot_goes_through_the_ensemble():
    assert DirectRoute.of(_config(), "") is None
