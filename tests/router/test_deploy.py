"""infra/deploy: the Kubernetes manifests `rhumbatron fleet manifests` renders from a
deployment's settings carry the fleet's members as workloads with the replicas, probes, static
membership and scaling bounds the settings give, refuse the settings a stateless pod cannot
honour, and the committed rendering is the one the committed settings give; the Dockerfile
passes hadolint. (Their schemas: tests/router/test_manifest_schemas.py; run as processes:
tests/router/test_pods_as_processes.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication

from router import deploy
from router.settings import settings_elsewhere
from streams.errors import ConfigurationError
from streams.topology import group_id
from tests.support.deployment import CONFIG, DEPLOY, deployment_config
from tests.support.environment import ROOT

RENDERED = DEPLOY / "k8s" / "rhumbatron.yaml"
KUBERNETES = "1.34"
KEDA = {"ScaledObject": ScaledObject, "TriggerAuthentication": TriggerAuthentication}


def _render(path: Path) -> list[dict[str, Any]]:
    settings = settings_elsewhere(path)
    return deploy.manifests(settings, path.read_text(), image="rhumbatron:test")


def _by(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _env(workload: dict[str, Any]) -> dict[str, Any]:
    container = workload["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_committed_rendering_is_what_the_committed_settings_give() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "router.cli", "fleet", "manifests", str(CONFIG)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == RENDERED.read_text(), (
        "infra/deploy/k8s/rhumbatron.yaml is stale: rhumbatron fleet manifests "
        "infra/deploy/config.toml > infra/deploy/k8s/rhumbatron.yaml"
    )


def test_the_workloads_are_the_fleets_members() -> None:
    docs = _render(CONFIG)
    settings = settings_elsewhere(CONFIG)
    partitions = len(settings.topology.stream_names()) * settings.partitions
    stateful, stateless = _by(docs, "StatefulSet"), _by(docs, "Deployment")
    for slug, count in settings.fleet_subscriptions.items():
        if count == 0:
            assert slug not in stateful and slug not in stateless
            continue
        workload = stateful[slug]  # static membership: the pod's name is its member id
        assert workload["spec"]["replicas"] == count
        env = _env(workload)
        assert env["RHUMBATRON_GROUP_INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        container = workload["spec"]["template"]["spec"]["containers"][0]
        assert container["args"] == ["consume", "--subscription", slug]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert env["RHUMBATRON_METRICS_PORT"] == str(deploy.PROBE_PORT)
        scaled = _by(docs, "ScaledObject")[slug]["spec"]
        assert scaled["maxReplicaCount"] == partitions
        assert scaled["minReplicaCount"] == count
        assert scaled["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": slug,
        }
        assert scaled["triggers"][0]["metadata"]["consumerGroup"] == group_id(slug, "prod")
        assert _by(docs, "PodDisruptionBudget")[slug]["spec"]["maxUnavailable"] == 1
    assert set(stateless) == {"publisher-1", "dead-letter-consumer", "operator-server"}
    # A new publisher pod stands by until the old one lets the outbox's lock go: a rolling
    # update is safe. The causal router leaves the outbox it shares with publisher-1 to it.
    assert "strategy" not in stateless["publisher-1"]["spec"]
    assert _env(stateful["causal-router"])["RHUMBATRON_ROUTER_PUBLISH_OUTBOX"] == "false"
    assert "RHUMBATRON_ROUTER_PUBLISH_OUTBOX" not in _env(stateful["audit-archiver"])
    # The operator server answers through its Service: bound on every address, both opt-ins.
    server = stateless["operator-server"]["spec"]["template"]["spec"]["containers"][0]
    assert server["args"] == ["serve", "--allow-remote"]
    hosts = json.loads(_env(stateless["operator-server"])["RHUMBATRON_OPERATOR_ALLOWED_HOSTS"])
    assert "operator-server.rhumbatron.svc.cluster.local" in hosts
    assert "operator-server" in hosts
    rollup = stateful["analytics-rollup"]["spec"]
    assert rollup["volumeClaimTemplates"][0]["metadata"]["name"] == "state"
    grace = int(settings.fleet_stop_timeout_s) + 5
    for workload in [*stateful.values(), *stateless.values()]:
        pod = workload["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == grace
        assert pod["securityContext"]["runAsNonRoot"] is True
    config = _by(docs, "ConfigMap")["rhumbatron-config"]["data"]["config.toml"]
    assert config == CONFIG.read_text()


def test_dynamic_membership_gives_deployments(tmp_path: Path) -> None:
    docs = _render(deployment_config(tmp_path, fleet_static_membership=False))
    projector = _by(docs, "Deployment")["project-view-projector"]
    assert "RHUMBATRON_GROUP_INSTANCE_ID" not in _env(projector)
    scaled = _by(docs, "ScaledObject")["project-view-projector"]["spec"]
    assert scaled["scaleTargetRef"]["kind"] == "Deployment"


def test_a_queue_of_your_own_in_fleet_workers_is_a_workload_of_its_worker(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        CONFIG.read_text()
        + '\n[queues.payments]\nretries = 5\n\n[fleet_workers]\npayments = "ok"\n'
    )
    docs = _render(path)
    worker = _by(docs, "Deployment")["worker-payments-1"]
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["worker", "--queue", "payments", "--handler", "ok"]
    assert worker["spec"]["replicas"] == 1
    kubernetes_validate.validate(worker, KUBERNETES, strict=True)
    # Its pods read the queue's policy from the same file as every other pod.
    assert "[queues.payments]" in _by(docs, "ConfigMap")["rhumbatron-config"]["data"]["config.toml"]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"archive_store": "local"}, "archive_store"),
        ({"fleet_outboxes": ["outbox.sqlite"]}, "fleet_outboxes"),
        ({"fleet_outboxes": ["postgresql://u:secret@db/rhumbatron"]}, "PGPASSWORD"),
    ],
)
def test_settings_a_stateless_pod_cannot_honour_are_refused(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        _render(deployment_config(tmp_path, **changes))


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    done = subprocess.run(
        [str(hadolint), str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"ARG VERSION={version}" in (DEPLOY / "Dockerfile").read_text()
