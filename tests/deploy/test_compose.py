"""docker-compose.yml's commands, run by bash as the containers would run them (with pip, tritonserver and
tritonllm replaced by stand-ins that print their arguments): the repository alone by default, and with a models
folder `tritonllm serve` and the shim given the same models, in arguments `tritonllm` accepts."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tritonllm.launcher import cli

ROOT = Path(__file__).resolve().parents[2]
STAND_INS = {
    "pip": "exit 0",
    "tritonserver": 'printf "%q " tritonserver "$@"',
    "tritonllm": 'printf "%q " tritonllm "$@"',
}


def run(service: str, more: Path, env: dict[str, str]) -> list[str]:
    """The command the service's container ends in (the last a stand-in printed), with /models/more at `more`."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][service]
    script = compose["command"][2].replace("$$", "$").replace("/models/more", str(more))
    bin_dir = more.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in STAND_INS.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\necho\n")
        (bin_dir / name).chmod(0o755)
    environment = {k: v for k, v in (compose.get("environment") or {}).items() if not str(v).startswith("${")}
    environment |= env | {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env=environment).stdout
    return shlex.split(out.strip().splitlines()[-1])


@pytest.mark.parametrize("service", ["triton", "shim"])
def test_without_more_models_the_containers_run_as_before(service, tmp_path):
    (tmp_path / "more").mkdir()
    command = run(service, tmp_path / "more", {"TRITONLLM_MODEL_DIR": str(tmp_path / "model")})
    if service == "triton":
        assert command[0] == "tritonserver" and "--model-repository=/workspace/model_repository" in command
    else:
        assert command[:2] == ["tritonllm", "shim"] and "--model-dir" not in " ".join(command)


def test_a_models_folder_reaches_serve_and_the_shim_alike(tmp_path):
    (tmp_path / "more" / "tiny").mkdir(parents=True)
    env = {"TRITONLLM_MODEL_DIR": "/workspace/models/SmolLM2-135M-Instruct", "MODELS_MAX": "1"}
    serve, shim = (cli.build_parser().parse_args(run(s, tmp_path / "more", env)[1:]) for s in ("triton", "shim"))
    assert serve.func is cli.serve and serve.no_shim and serve.triton_host == "0.0.0.0"
    assert shim.func is cli.shim and shim.triton_grpc_url == "triton:8001"
    for args in (serve, shim):
        assert args.model_dir == ["/workspace/models/SmolLM2-135M-Instruct"]
        assert args.models_folder == str(tmp_path / "more") and args.models_max == 1
