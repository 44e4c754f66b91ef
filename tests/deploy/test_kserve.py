"""deploy/kserve's ServingRuntime and InferenceService, checked field by field against KServe's own API
types (the models its Python SDK generates from the CRDs' OpenAPI): an unknown field fails, and every
Kubernetes type inside (containers, probes, resources, metadata) is validated against the Kubernetes API's
strict schemas."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

KSERVE = Path(__file__).resolve().parents[2] / "deploy" / "kserve"
KUBERNETES = "1.30.0"
SCHEMAS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{KUBERNETES}-local-strict"


def kserve_models():
    """kserve.models without kserve/__init__.py, which starts its model server's imports (fastapi, grpc, ...);
    the Makefile installs the wheel without those dependencies."""
    if "kserve" not in sys.modules:
        package = types.ModuleType("kserve")
        package.__path__ = [str(Path(importlib.util.find_spec("kserve").origin).parent)]
        sys.modules["kserve"] = package
    return importlib.import_module("kserve.models")


def kubernetes_type(value, name: str, where: str) -> None:
    """A Kubernetes API type (V1Container, V1ObjectMeta, ...) against its strict schema."""
    files = sorted(SCHEMAS.glob(f"{name[2:].lower()}-*.json"))
    assert files, f"{where}: no schema for {name}"
    schema = schema_contents(f"kubernetes-json-schema/{SCHEMAS.name}/{files[0].name}", KUBERNETES)
    definitions = schema_contents(f"kubernetes-json-schema/{SCHEMAS.name}/_definitions.json", KUBERNETES)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    try:
        jsonschema.Draft202012Validator(schema, registry=registry).validate(value)
    except jsonschema.ValidationError as e:
        raise AssertionError(f"{where}: {e.message}") from e


def check(value, kind: str, where: str) -> None:
    """`value` as KServe's API type `kind` ('V1beta1PredictorSpec', 'list[V1Container]', 'str', ...)."""
    if match := re.fullmatch(r"list\[(.+)\]", kind):
        assert isinstance(value, list), f"{where} must be a list"
        for i, item in enumerate(value):
            check(item, match.group(1), f"{where}[{i}]")
    elif match := re.fullmatch(r"dict\(str, (.+)\)", kind):
        assert isinstance(value, dict), f"{where} must be a map"
        for key, item in value.items():
            check(item, match.group(1), f"{where}.{key}")
    elif kind.startswith(("V1beta1", "V1alpha1")):
        model = getattr(kserve_models(), kind)
        fields = {wire: model.openapi_types[name] for name, wire in model.attribute_map.items()}
        assert isinstance(value, dict), f"{where} must be an object"
        unknown = set(value) - set(fields)
        assert not unknown, f"{where}: {kind} has no field {sorted(unknown)}"
        for key, item in value.items():
            check(item, fields[key], f"{where}.{key}")
    elif kind.startswith("V1"):
        kubernetes_type(value, kind, where)
    else:
        python = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}[kind]
        assert isinstance(value, python), f"{where} must be {kind}, got {value!r}"


@pytest.mark.parametrize(
    ("file", "kind", "api_version"),
    [
        ("servingruntime.yaml", "V1alpha1ServingRuntime", "serving.kserve.io/v1alpha1"),
        ("inferenceservice.yaml", "V1beta1InferenceService", "serving.kserve.io/v1beta1"),
    ],
)
def test_each_manifest_is_valid_against_kserves_api_types(file, kind, api_version):
    manifest = yaml.safe_load((KSERVE / file).read_text())
    assert manifest["apiVersion"] == api_version and manifest["kind"] == kind.removeprefix("V1alpha1").removeprefix(
        "V1beta1"
    )
    check(manifest, kind, manifest["kind"])


def test_the_checker_refuses_an_unknown_field_and_a_bad_kubernetes_type():
    service = yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text())
    service["spec"]["predictor"]["model"]["storageUrl"] = "pvc://typo"
    with pytest.raises(AssertionError, match="storageUrl"):
        check(service, "V1beta1InferenceService", "InferenceService")
    runtime = yaml.safe_load((KSERVE / "servingruntime.yaml").read_text())
    runtime["spec"]["containers"][0]["ports"][0]["containerPort"] = "9000"
    with pytest.raises(AssertionError, match="containers"):
        check(runtime, "V1alpha1ServingRuntime", "ServingRuntime")


def test_the_runtime_serves_what_kserve_downloads_with_tritons_protocol():
    runtime = yaml.safe_load((KSERVE / "servingruntime.yaml").read_text())
    command = runtime["spec"]["containers"][0]["command"]
    assert command[:3] == ["tritonllm", "serve", "--no-shim"] and "--model-dir=/mnt/models" in command
    service = yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text())
    assert service["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
