"""The Grafana dashboard (deploy/helm/tritonllm/dashboards/tritonllm.json) queries only series a running server
exports: every metric a panel names is on Triton's metrics port or the shim's /metrics, with the labels the
panel groups by."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from .conftest import MODEL

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "tritonllm" / "dashboards" / "tritonllm.json"
METRIC = re.compile(r"\b((?:tritonllm|nv)_[a-z_]+)\b")
GROUPING = re.compile(r"\bby \(([^)]*)\)")
HELLO = [{"role": "user", "content": "Hello"}]
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", re.MULTILINE)


def exported(text: str) -> dict[str, set[str]]:
    """Each series name in a Prometheus text page, with the label names it carries."""
    series: dict[str, set[str]] = {}
    for name, labels in SAMPLE.findall(text):
        series.setdefault(name, set()).update(re.findall(r'(\w+)="', labels or ""))
    return series


def queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


@pytest.fixture(scope="module")
def series(triton, shim_url, openai_client) -> dict[str, set[str]]:
    openai_client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)  # every shim series labelled
    triton_page = httpx.get(triton.metrics_url, timeout=10).text
    shim_page = httpx.get(f"{shim_url}/metrics", timeout=10).text
    return exported(triton_page) | exported(shim_page)


def test_the_dashboard_has_panels_on_every_family():
    names = {name for expr in queries() for name in METRIC.findall(expr)}
    for family in ("tritonllm_time_to_first_token", "tritonllm_kv_blocks", "tritonllm_shim_", "nv_inference"):
        assert any(name.startswith(family) for name in names), family


@pytest.mark.parametrize("expr", queries())
def test_every_query_names_exported_series_and_labels(series, expr):
    names = METRIC.findall(expr)
    assert names, f"no metric in {expr}"
    for name in names:
        assert name in series, f"{name} is not exported"
        for grouping in GROUPING.findall(expr):
            labels = {label.strip() for label in grouping.split(",")}
            assert labels <= series[name], f"{name} has no label {labels - series[name]}"
