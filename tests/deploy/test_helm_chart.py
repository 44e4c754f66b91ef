"""The Helm chart in deploy/helm/tritonllm, rendered by Helm's own engine (helm-python-sdk binds Helm's Go
library) and each manifest validated against the Kubernetes API's schemas (kubernetes-validate, strict: an
unknown field fails too)."""

from __future__ import annotations

import json
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tritonllm.launcher import cli

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "tritonllm"
KUBERNETES = "1.30.0"
EVERYTHING_ON = {
    "gpu": 2,
    "engine": {"llmInstances": 2, "args": ["--dtype", "bfloat16", "--max-num-seqs", "128"]},
    "autoscaling": {"enabled": True},
    "model": {"persistentVolumeClaim": "models"},
    "shim": {"apiKeySecret": "tritonllm-api-key"},
    "grafanaDashboard": {"enabled": True},
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


def render(values: dict | None) -> dict[str, dict]:
    """The chart's manifests by kind."""
    chart = helm.Chart.load(CHART)
    manifests = {}
    for path, text in chart.render(values, name="demo", namespace="serving").items():
        if path.endswith(".yaml"):
            for manifest in yaml.safe_load_all(text):
                if manifest:
                    manifests[manifest["kind"]] = manifest
    return manifests


def test_the_chart_lints_clean():
    report = helm.lint(CHART, strict=True, kube_version=f"v{KUBERNETES}")
    errors = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not errors


@pytest.mark.parametrize("values", [None, EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_every_manifest_is_valid_against_the_kubernetes_schemas(values):
    manifests = render(values)
    optional = {"HorizontalPodAutoscaler", "ConfigMap"}
    expected = {"Deployment", "Service", "PodDisruptionBudget"} | (optional if values else set())
    assert set(manifests) == expected
    for manifest in manifests.values():
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)


def test_the_dashboard_configmap_holds_the_dashboard_file_for_grafanas_sidecar():
    configmap = render({"grafanaDashboard": {"enabled": True}})["ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads((CHART / "dashboards" / "tritonllm.json").read_text())
    assert json.loads(configmap["data"]["tritonllm.json"]) == dashboard


def test_the_validator_refuses_what_kubernetes_would():
    deployment = render(None)["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_the_pod_runs_triton_and_the_shim_with_probes_drain_and_gpus():
    manifests = render(EVERYTHING_ON)
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    triton, shim = pod["containers"]
    assert triton["command"][:3] == ["tritonllm", "serve", "--no-shim"]
    assert "--llm-instances=2" in triton["command"] and "bfloat16" in triton["command"]
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["lifecycle"]["preStop"]["exec"]["command"][:2] == ["tritonllm", "drain"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert shim["command"][:2] == ["tritonllm", "shim"] and "--triton-grpc-url=127.0.0.1:8001" in shim["command"]
    assert shim["readinessProbe"]["httpGet"]["path"] == "/health"
    assert pod["terminationGracePeriodSeconds"] > 60  # the drain fits inside it
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "models"
    hpa = manifests["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]
    assert hpa["metric"]["name"] == "tritonllm_requests_waiting"  # the queue depth the engines export


def test_without_a_volume_claim_an_init_container_fetches_the_default_model():
    pod = render(None)["Deployment"]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["name"] == "fetch-model"
    assert "emptyDir" in pod["volumes"][0]


def test_the_service_exposes_tritons_ports_only_when_asked_and_only_behind_the_key():
    def exposed(values: dict | None) -> set[str]:
        return {port["name"] for port in render(values)["Service"]["spec"]["ports"]}

    assert exposed(None) == {"openai", "metrics"}  # inference and stop only through the shim's key
    with pytest.raises(Exception, match="needs shim.apiKeySecret"):
        render({"service": {"exposeTriton": True}})
    guarded = {"service": {"exposeTriton": True}, "shim": {"apiKeySecret": "tritonllm-api-key"}}
    assert exposed(guarded) == {"openai", "metrics", "http", "grpc"}
    triton, shim = render(guarded)["Deployment"]["spec"]["template"]["spec"]["containers"]
    for container in (triton, shim):  # the same key: Triton asks for it, the shim sends it
        key = {e["name"]: e for e in container["env"]}["TRITONLLM_API_KEY"]
        assert key["valueFrom"]["secretKeyRef"] == {"name": "tritonllm-api-key", "key": "api-key"}


def test_more_models_reach_serve_and_the_shim_alike(tmp_path):
    values = {"model": {"persistentVolumeClaim": "models", "more": ["tiny", "q.gguf"], "modelsMax": 2}}
    manifests = render(values)
    kubernetes_validate.validate(manifests["Deployment"], KUBERNETES, strict=True)
    triton, shim = manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert shim["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True}]
    parser = cli.build_parser()
    serve_args, shim_args = parser.parse_args(triton["command"][1:]), parser.parse_args(shim["command"][1:])
    models = ["/models/SmolLM2-135M-Instruct", "/models/tiny", "/models/q.gguf"]
    assert serve_args.model_dir == shim_args.model_dir == models
    assert serve_args.models_max == shim_args.models_max == 2
    assert "--model-dir" not in " ".join(
        render(None)["Deployment"]["spec"]["template"]["spec"]["containers"][1]["command"]
    )
