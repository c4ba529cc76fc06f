"""Every object ``rhumbatron fleet manifests`` renders, for the shipped deployment
(infra/deploy/config.toml) and variants of it that render other objects or other shapes of the
same ones, is valid against its schema: the Kubernetes kinds against Kubernetes' own
(kubernetes-validate, strict: an unknown field fails), KEDA's ScaledObject and
TriggerAuthentication against KEDA's CRD models (cloudcoil.models.keda), the PodMonitor against
the Prometheus Operator's (cloudcoil.models.prometheus_operator). The CRD models accept keys
they do not know, so a CRD object must also come back whole from the model: a key it loses is
one the CRD does not have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication
from cloudcoil.models.prometheus_operator.v1 import PodMonitor
from pydantic import BaseModel

from router import deploy
from router.settings import settings_elsewhere
from tests.support.deployment import CONFIG as SHIPPED
from tests.support.deployment import deployment_config

KUBERNETES = "1.34"  # kubernetes-validate's schemas of the oldest Kubernetes we deploy to
CRD_MODELS: dict[str, type[BaseModel]] = {
    "ScaledObject": ScaledObject,
    "TriggerAuthentication": TriggerAuthentication,
    "PodMonitor": PodMonitor,
}
# name -> settings changed from the shipped ones
VARIANTS: dict[str, dict[str, Any]] = {
    "shipped": {},
    "dynamic membership, no SASL, no TLS": {
        "fleet_static_membership": False,
        "kafka_security_protocol": "PLAINTEXT",
        "kafka_sasl_mechanism": None,
        "kafka_sasl_username": None,
        "kafka_ssl_ca_file": None,
    },
    "SCRAM without TLS": {
        "kafka_security_protocol": "SASL_PLAINTEXT",
        "kafka_sasl_mechanism": "SCRAM-SHA-256",
        "kafka_ssl_ca_file": None,
    },
    "outboxes, workers, a pump, allowed hosts": {
        "fleet_outboxes": [
            "postgresql://rhumbatron@postgres:5432/rhumbatron",
            "postgresql://writer@orders-db:5432/orders",
        ],
        "fleet_workers": {
            "payments": "router.workers.drills:OkHandler",
            "integration": "https://hooks.example.com/commands",
        },
        "fleet_worker_processes": 2,
        "queues": {"payments": {"retries": 5}},
        "fleet_feed": "https://feed.example.com/events",
        "operator_allowed_hosts": ["ops.example.com"],
        "fleet_pod_cpu_request": "2",
        "fleet_pod_memory_request": "1Gi",
        "fleet_pod_memory_limit": "2Gi",
    },
    "no KEDA, no pod monitor, no rollup": {
        "fleet_keda": False,
        "fleet_pod_monitor": False,
        "fleet_analytics_rollup": False,
    },
}


def _rendered(path: Path) -> list[dict[str, Any]]:
    return deploy.manifests(
        settings_elsewhere(path), path.read_text(), image="rhumbatron:test", namespace="team-a"
    )


def _check(doc: dict[str, Any]) -> None:
    model = CRD_MODELS.get(doc["kind"])
    if model is None:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        return
    kept = model.model_validate(doc).model_dump(by_alias=True, exclude_unset=True)
    assert kept == doc, f"{doc['kind']} {doc['metadata']['name']}: the CRD has no such field"


@pytest.mark.parametrize("changes", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_rendered_object_is_valid_against_its_schema(
    tmp_path: Path, changes: dict[str, Any]
) -> None:
    docs = _rendered(deployment_config(tmp_path, **changes))
    for doc in docs:
        _check(doc)


def test_the_variants_render_every_kind(tmp_path: Path) -> None:
    """The schemas checked are those of every kind the renderer has: no kind goes unchecked."""
    kinds: set[str] = set()
    for index, changes in enumerate(VARIANTS.values()):
        folder = tmp_path / str(index)
        folder.mkdir()
        kinds |= {d["kind"] for d in _rendered(deployment_config(folder, **changes))}
    assert kinds == {
        "Namespace",
        "ConfigMap",
        "Deployment",
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "ScaledObject",
        "TriggerAuthentication",
        "PodMonitor",
    }


def test_a_misspelt_field_is_refused_in_each_crd() -> None:
    docs = {d["kind"]: d for d in _rendered(SHIPPED)}
    docs["ScaledObject"]["spec"]["triggers"][0]["authenticationReference"] = {"name": "x"}
    docs["TriggerAuthentication"]["spec"]["secretTargetRefs"] = []
    docs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    for kind in CRD_MODELS:
        with pytest.raises(AssertionError, match="the CRD has no such field"):
            _check(docs[kind])
    docs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["interval"] = "thirty seconds"
    with pytest.raises(ValueError, match="interval"):
        PodMonitor.model_validate(docs["PodMonitor"])
