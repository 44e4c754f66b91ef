"""deploy/Dockerfile, read by dockerfile-parse as Docker reads it, against what the repository and the charts
expect of the image: its sources exist, its base is the Triton release docker-compose runs, it exposes the
ports the Helm chart's containers use, its command is one `tritonllm` accepts, and an installed package carries
every file the native kernels are built from."""

from __future__ import annotations

import json
from fnmatch import fnmatch
from pathlib import Path

import tomllib
import yaml
from dockerfile_parse import DockerfileParser

from tritonllm.launcher import cli

ROOT = Path(__file__).resolve().parents[2]


def instructions(name: str) -> list[str]:
    parser = DockerfileParser(str(ROOT / "deploy" / "Dockerfile"))
    return [item["value"] for item in parser.structure if item["instruction"] == name]


def test_the_dockerfile_copies_what_exists_on_the_base_docker_compose_runs():
    parser = DockerfileParser(str(ROOT / "deploy" / "Dockerfile"))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert parser.baseimage in {service["image"] for service in compose["services"].values()}
    for copy in instructions("COPY"):
        *sources, _ = copy.split()
        assert all((ROOT / source).exists() for source in sources), copy
    installs = [run for run in instructions("RUN") if "pip install" in run and " -e ." in f"{run} "]
    assert installs and all("-c constraints.txt" in run for run in installs)


def test_every_install_of_the_project_takes_the_tested_versions():
    """constraints.txt pins what the engine builds on; an install without it takes whatever was released last."""
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "install" in line and " -e " in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    pinned = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    named = {dependency.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip() for dependency in project}
    assert {"transformers", "tokenizers", "llguidance", "gguf"} <= pinned.keys() <= named | {"huggingface_hub"}


def test_the_image_exposes_the_charts_ports_and_runs_a_command_tritonllm_accepts():
    exposed = {int(port) for line in instructions("EXPOSE") for port in line.split()}
    deployment = (ROOT / "deploy" / "helm" / "tritonllm" / "templates" / "deployment.yaml").read_text()
    chart_ports = {8000, 8001, 8002, 9000}
    assert all(f"containerPort: {port}" in deployment for port in chart_ports)
    assert chart_ports <= exposed
    (cmd,) = instructions("CMD")
    argv = json.loads(cmd)  # the exec form
    assert argv[0] == "tritonllm"
    args = cli.build_parser().parse_args(argv[1:])  # an unknown flag exits here
    assert args.func is cli.serve


def test_an_installed_package_carries_every_kernel_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["tritonllm"] == "tritonllm.launcher.cli:main"
    patterns = project["tool"]["setuptools"]["package-data"]["tritonllm.engine.kernels"]
    kernels = ROOT / "tritonllm" / "engine" / "kernels"
    sources = [path.name for path in kernels.iterdir() if path.is_file() and path.suffix != ".py"]
    assert sources and all(any(fnmatch(source, p) for p in patterns) for source in sources)


def test_the_image_installs_the_allocator_serve_preloads():
    """Without it Triton runs on glibc's malloc, a quarter of tritonserver's CPU (launcher/allocator.py)."""
    assert any("apt-get install" in run and "libtcmalloc-minimal4" in run for run in instructions("RUN"))
