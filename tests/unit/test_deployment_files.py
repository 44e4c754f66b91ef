"""What can be checked here of the files that deploy elsewhere (no Docker engine on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_docker_compose_serves_this_repository_on_triton_2_51():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    triton = compose["services"]["triton"]
    assert triton["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"  # the release that ships Triton 2.51
    assert "./:/workspace" in triton["volumes"]
    command = " ".join(triton["command"])
    assert "--model-repository=/workspace/model_repository" in command
    assert {"127.0.0.1:8000:8000", "127.0.0.1:8001:8001", "127.0.0.1:8002:8002"} <= set(triton["ports"])
    shim = " ".join(compose["services"]["shim"]["command"])
    assert "tritonllm shim --triton-grpc-url triton:8001" in shim


def test_every_model_has_its_config_and_code():
    for model in ("preprocessing", "llm", "postprocessing", "embedding"):
        assert (ROOT / "model_repository" / model / "config.pbtxt").exists()
        assert (ROOT / "model_repository" / model / "1" / "model.py").exists()
    assert (ROOT / "model_repository" / "ensemble" / "config.pbtxt").exists()


def test_perf_analyzer_input_uses_the_ensemble_names():
    data = json.loads((ROOT / "client" / "perf_analyzer_input.json").read_text())["data"]
    assert data and all({"text_input", "max_tokens", "stream"} == set(entry) for entry in data)
