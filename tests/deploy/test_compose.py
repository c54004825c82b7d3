"""deploy/compose.yaml validated by a compose-spec parser, its mounts, and the dashboard."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from compose_spec import PyCompose

from service.config.settings import Settings
from service.frontend.metrics import Metrics
from tests.deploy.conftest import DEPLOY, ROOT

_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def env_example() -> dict[str, str]:
    lines = (DEPLOY / ".env.example").read_text("utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def interpolated_compose() -> dict[str, object]:
    """The compose file as docker compose reads it with --env-file deploy/.env.example."""
    env = env_example()
    text = _VARIABLE.sub(
        lambda m: env.get(m.group(1)) or (m.group(2) or ""),
        (DEPLOY / "compose.yaml").read_text("utf-8"),
    )
    parsed: dict[str, object] = PyCompose.from_yaml(text).to_dict()
    return parsed


def test_compose_file_is_valid_and_has_the_four_services() -> None:
    compose = interpolated_compose()
    services = compose["services"]
    assert isinstance(services, dict)
    assert set(services) == {"api", "nginx", "prometheus", "grafana"}
    api = services["api"]
    assert api["healthcheck"]["test"][-1].endswith("/health")
    assert api["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert services["nginx"]["depends_on"]["api"]["condition"] == "service_healthy"
    assert any("/data/hf" in str(volume) for volume in api["volumes"])


def test_the_service_takes_the_environment_compose_gives_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every HYMT_* variable the api service gets, read into the settings as the service reads
    # them, and the engine's config built from them without a refusal (a setting the engine
    # does not know, or a value it refuses, would keep the deployment from starting).
    compose = interpolated_compose()
    services = compose["services"]
    assert isinstance(services, dict)
    environment = services["api"]["environment"]
    # An empty value (``${MAX_ROWS:-}``) reaches the process as an empty string.
    given = {
        name: "" if value is None else str(value)
        for name, value in environment.items()
        if name.startswith("HYMT_")
    }
    assert given
    for name in list(os.environ):
        if name.startswith("HYMT_"):
            monkeypatch.delenv(name)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)
    assert settings.model.model_id == "tencent/Hunyuan-MT-7B"
    assert settings.server.trusted_proxies == ["172.30.0.10"]
    config = settings.engine_config()
    assert config.model.model_id == settings.model.model_id
    known = {"HYMT_" + name.upper() for name in Settings.flat_names()}
    assert set(given) <= known, set(given) - known


def test_every_compose_variable_is_in_the_env_example() -> None:
    used = set(_VARIABLE.findall((DEPLOY / "compose.yaml").read_text("utf-8")))
    assert {name for name, _ in used} <= set(env_example())


def test_every_mounted_file_and_the_build_exist() -> None:
    text = (DEPLOY / "compose.yaml").read_text("utf-8")
    for source in re.findall(r"- (\./[^:]+):", text):
        assert (DEPLOY / source).exists(), source
    assert (ROOT / "deploy" / "Dockerfile").is_file()
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text("utf-8")
    assert re.search(r"^FROM nvidia/cuda:\S+runtime", dockerfile, re.M)
    assert re.search(r"^USER (?!root)\S+", dockerfile, re.M)
    # The fast engine compiles its kernels on CUDA: Triton needs a C compiler and Python's
    # headers.
    for package in ("gcc", "python3-dev"):
        assert re.search(rf"apt-get install[^&]*\s{package}\s", dockerfile), package


def exported_metric_names() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "histogram":
            names.update(f"{family.name}_{suffix}" for suffix in ("bucket", "count", "sum"))
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "info":
            names.add(f"{family.name}_info")
    return names


def test_dashboard_queries_only_metrics_the_service_exports() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "hunyuan-mt.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in expressions for name in re.findall(r"\bhymt_\w+", expr)}
    assert used, "the dashboard queries no metric"
    assert used <= exported_metric_names(), used - exported_metric_names()
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("request rate", "error", "latency", "queue depth", "queue wait", "batch size",
                  "tokens", "cache hit", "gpu memory"):  # fmt: skip
        assert topic in titles, topic


def test_grafana_provisioning_points_at_the_dashboard_folder() -> None:
    provider = (DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml").read_text()
    compose = (DEPLOY / "compose.yaml").read_text("utf-8")
    folder = re.search(r"path: (\S+)", provider)
    assert folder is not None
    assert f"./grafana/dashboards:{folder.group(1)}" in compose
    assert Path(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").is_file()


def test_the_replicas_override_adds_a_replica_on_its_own_gpu_and_redis() -> None:
    class _Loader(yaml.SafeLoader):
        pass

    # docker compose's merge tags: the value itself, replacing what is inherited.
    _Loader.add_constructor("!override", _Loader.construct_mapping)  # type: ignore[type-var]
    text = (DEPLOY / "compose.replicas.yaml").read_text("utf-8")
    override = yaml.load(text, Loader=_Loader)  # a safe loader with one tag more
    services = override["services"]
    assert set(services) == {"api", "api-1", "nginx", "redis"}
    replica = services["api-1"]
    assert replica["extends"] == {"file": "compose.yaml", "service": "api"}
    assert "!override" in text.split("api-1:")[1].split("nginx:")[0]
    devices = replica["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [
        {"driver": "nvidia", "device_ids": ["${GPU_ID_1:-1}"], "capabilities": ["gpu"]}
    ]
    assert replica["networks"]["default"]["aliases"] == ["api"]  # nginx's `server api:8000`
    for name in ("api", "api-1"):
        assert services[name]["environment"]["HYMT_REDIS_URL"] == "redis://redis:6379/0"
    assert set(services["nginx"]["depends_on"]) == {"api", "api-1"}
    used = {name for name, _ in _VARIABLE.findall(text)}
    assert used <= set(env_example())
    # The base file it extends is unchanged and still valid.
    assert "api" in interpolated_compose()["services"]  # type: ignore[operator]
