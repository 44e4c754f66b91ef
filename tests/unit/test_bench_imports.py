"""The benchmarks stay out of `make test`, so nothing else notices when a rename in the package leaves one of
them importing a name that is gone (bench/run.py's ensemble case asked for triton_client.ENSEMBLE for weeks after
several LLMs per server renamed it). Every `from tritonllm... import name` in bench/, at the top of a file or
inside a function, must name something the package still has."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def package_imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of each name a bench script imports from the tritonllm package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tritonllm"):
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
    return found


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_name_a_bench_script_imports_from_the_package_exists(script: Path) -> None:
    missing = []
    for module, name, line in package_imports(script):
        imported = importlib.import_module(module)
        if not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule: `from tritonllm.formats import gguf`
            except ModuleNotFoundError:
                missing.append(f"{script.name}:{line}: from {module} import {name}")
    assert not missing, "bench scripts import names the package no longer has:\n" + "\n".join(missing)


def test_the_bench_scripts_import_from_the_package() -> None:
    """The check above reads the files: it must find their imports, those inside functions too, or it would pass on
    nothing."""
    names = {(module, name) for module, name, _ in package_imports(BENCH / "run.py")}
    assert ("tritonllm.wire.triton_names", "REPOSITORY_NAMES") in names  # imported inside EnsembleStreams._one
