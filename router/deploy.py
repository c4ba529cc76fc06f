"""The fleet on Kubernetes: the members :func:`router.fleet.plan` gives, as manifests.

What ``rhumbatron fleet`` runs on one machine runs here as workloads: the members that share a
command line (``causal-router-1``, ``causal-router-2``) are the replicas of one workload. Each
subscription is a Deployment — a StatefulSet when ``fleet_static_membership`` is set, its pod's
stable name being its ``group.instance.id`` — with a PodDisruptionBudget and a KEDA
``ScaledObject`` that scales it on its group's lag, at most to its partitions. The publishers,
the pump, the workers, the dead-letter consumer, the rollup and the operator server are one
workload each.

Every pod reads the settings from the ConfigMap's TOML file (``RHUMBATRON_CONFIG``) and the
secrets from the Secret's keys as environment variables, answers ``/healthz`` (liveness) and
``/readyz`` (readiness) on its metrics port, and keeps no state of its own: the outbox is
PostgreSQL, the archive S3, the rest Redis; the analytics rollup's tables are on a
PersistentVolumeClaim. A setting that would need a pod's own disk (a SQLite outbox, the local
archive) is a ConfigurationError naming it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from router.fleet import Member, plan
from router.settings import Settings
from streams.errors import ConfigurationError
from streams.topology import group_id

APP = "rhumbatron"
CONFIG_DIR = "/etc/rhumbatron"
STATE_DIR = "/var/lib/rhumbatron"
PROBE_PORT = 9400
# The environment a member's plan gives that a pod sets otherwise: its name and static id come
# from the pod's own name, its probe port is PROBE_PORT, and a secret comes from the Secret.
POD_SETS = frozenset(
    {
        "RHUMBATRON_PROCESS_NAME",
        "RHUMBATRON_GROUP_INSTANCE_ID",
        "RHUMBATRON_METRICS_PORT",
        "RHUMBATRON_HTTP_HANDLER_SECRETS",
    }
)


# The probes, stated whole: Kubernetes gives readiness no deadline, so a pod that is not ready
# within what its liveness probe allows (initialDelaySeconds + failureThreshold x periodSeconds)
# is one a test holds as failed (tests/router/test_pods_as_processes.py).
@dataclass(frozen=True)
class PodProbe:
    """An HTTP probe of the ``probes`` port."""

    path: str
    initial_delay_s: int
    period_s: int
    failures: int
    timeout_s: int = 3

    def manifest(self) -> dict[str, Any]:
        return {
            "httpGet": {"path": self.path, "port": "probes"},
            "initialDelaySeconds": self.initial_delay_s,
            "periodSeconds": self.period_s,
            "failureThreshold": self.failures,
            "timeoutSeconds": self.timeout_s,
        }


LIVENESS = PodProbe("/healthz", initial_delay_s=10, period_s=10, failures=3)
# The rollup starts slowest: its faust worker joins its group and recovers its tables first.
ROLLUP_LIVENESS = PodProbe("/healthz", initial_delay_s=30, period_s=10, failures=3)
READINESS = PodProbe("/readyz", initial_delay_s=5, period_s=5, failures=2)
# Where every pod's /metrics is: plain annotations, and the Prometheus Operator's PodMonitor.
SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(PROBE_PORT),
    "prometheus.io/path": "/metrics",
}
SCRAPE_INTERVAL = "30s"
OPERATOR_NAME = "operator-server"
# The settings a deployment keeps in its Secret: each is a key of the Secret, read as the
# environment variable of the same name. (Everything else goes in the ConfigMap's TOML file.)
SECRET_KEYS = (
    "RHUMBATRON_KAFKA_SASL_PASSWORD",
    "RHUMBATRON_REDIS_PASSWORD",
    "RHUMBATRON_ARCHIVE_S3_ACCESS_KEY",
    "RHUMBATRON_ARCHIVE_S3_SECRET_KEY",
    "RHUMBATRON_OPERATOR_TOKEN",
    "RHUMBATRON_OPERATOR_READ_TOKEN",
    "RHUMBATRON_OPERATOR_TOKENS",  # more operators, each with a token: '{"alice": "…"}'
    "RHUMBATRON_HTTP_HANDLER_SECRETS",  # what the workers of HTTP handlers sign with
    "PGPASSWORD",  # libpq's: the outboxes' URLs name their user, never a password
)
# What KEDA's Kafka scaler logs in with (its TriggerAuthentication), in the same Secret: the
# mechanism as KEDA spells it (plaintext, scram_sha256, scram_sha512), "enable" for TLS, the user.
KEDA_SECRET_KEYS = ("KEDA_KAFKA_SASL", "KEDA_KAFKA_TLS", "KEDA_KAFKA_USERNAME")
Manifest = dict[str, Any]


def manifests(
    settings: Settings, config_toml: str, *, image: str, namespace: str = APP
) -> list[Manifest]:
    """The manifests of the fleet ``settings`` describe (``config_toml``: the TOML file those
    settings were read from, which the ConfigMap carries), in the order to apply them."""
    if settings.archive_store == "local" and settings.fleet_subscriptions.get("audit-archiver"):
        raise ConfigurationError(
            "archive_store: 'local' keeps the archive on a pod's own disk; a deployment "
            "archives to S3 (archive_store = 's3', archive_s3_*) or not at all ('none')"
        )
    for address in settings.fleet_outboxes:
        if not address.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError(
                f"fleet_outboxes: {address!r} is a SQLite file, on a pod's own disk; a "
                "deployment's outboxes are PostgreSQL (postgresql://…)"
            )
        if urlsplit(address).password:
            raise ConfigurationError(
                "fleet_outboxes: an outbox URL carries its password into the pods' command "
                "lines; leave it out and keep it in the Secret as PGPASSWORD"
            )
    meta = {"namespace": namespace}
    out: list[Manifest] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{APP}-config", **meta},
            "data": {"config.toml": config_toml},
        },
    ]
    partitions = len(settings.topology.stream_names()) * settings.partitions
    for name, replicas in _workloads(plan(settings)):
        member = replicas[0]
        static = settings.fleet_static_membership and member.subscription is not None
        stateful = static or member.argv[0] == "analytics-rollup"
        out.append(_workload(settings, name, member, len(replicas), stateful, static, image, meta))
        if stateful:
            out.append(_headless_service(name, meta))
        if member.subscription is not None:
            out.append(_disruption_budget(name, meta))
        if member.subscription is not None and settings.fleet_keda:
            out.append(_scaled_object(settings, name, member, len(replicas), partitions, meta))
        if member.argv[0] == "serve":
            out.append(_service(settings, name, meta))
    if settings.kafka_sasl_mechanism is not None and any(m["kind"] == "ScaledObject" for m in out):
        out.append(_trigger_authentication(settings, meta))
    if settings.fleet_pod_monitor:
        out.append(_pod_monitor(meta))
    return out


def _workloads(members: Sequence[Member]) -> list[tuple[str, list[Member]]]:
    """Members running the same command line, as (the workload's name, its replicas)."""
    groups: dict[tuple[str, ...], list[Member]] = {}
    for member in members:
        groups.setdefault(member.argv, []).append(member)
    out = []
    for replicas in groups.values():
        name = replicas[0].name
        if len(replicas) > 1 or replicas[0].subscription is not None:
            name = name.rsplit("-", 1)[0]  # causal-router-1 -> causal-router
        out.append((name, replicas))
    return out


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": name}


def _container(
    settings: Settings, name: str, member: Member, static: bool, image: str, namespace: str
) -> Any:
    env: list[dict[str, Any]] = [
        {"name": "RHUMBATRON_CONFIG", "value": f"{CONFIG_DIR}/config.toml"},
        {"name": "RHUMBATRON_STATE_DIR", "value": STATE_DIR},
        {"name": "RHUMBATRON_METRICS_HOST", "value": "0.0.0.0"},
        {"name": "RHUMBATRON_METRICS_PORT", "value": str(PROBE_PORT)},
        # The pod's name names the process in its group (client.id) and, in a StatefulSet, is
        # its stable static member id: a restarted pod keeps its partitions.
        {"name": "RHUMBATRON_PROCESS_NAME", "valueFrom": _pod_name()},
    ]
    if static:
        env.append({"name": "RHUMBATRON_GROUP_INSTANCE_ID", "valueFrom": _pod_name()})
    env += [{"name": k, "value": v} for k, v in member.env.items() if k not in POD_SETS]
    args = list(member.argv)
    ports = [{"name": "probes", "containerPort": PROBE_PORT}]
    if member.argv[0] == "serve":
        # Reached through its Service: bound on every address (the double opt-in: the address
        # and --allow-remote), answering the Service's DNS names besides the configured ones.
        args.append("--allow-remote")
        hosts = [*settings.operator_allowed_hosts, *_service_names(name, namespace)]
        hosts += ["localhost", "127.0.0.1"]
        env.append({"name": "RHUMBATRON_OPERATOR_HOST", "value": "0.0.0.0"})
        env.append(
            {
                "name": "RHUMBATRON_OPERATOR_ALLOWED_HOSTS",
                "value": json.dumps(list(dict.fromkeys(hosts)), separators=(",", ":")),
            }
        )
        ports.append({"name": "http", "containerPort": settings.operator_port})
    return {
        "name": name,
        "image": image,
        "args": args,
        "env": env,
        "envFrom": [{"secretRef": {"name": f"{APP}-secrets", "optional": True}}],
        "ports": ports,
        "livenessProbe": (
            ROLLUP_LIVENESS if member.argv[0] == "analytics-rollup" else LIVENESS
        ).manifest(),
        "readinessProbe": READINESS.manifest(),
        "resources": {
            "requests": {
                "cpu": settings.fleet_pod_cpu_request,
                "memory": settings.fleet_pod_memory_request,
            },
            "limits": {"memory": settings.fleet_pod_memory_limit},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tls", "mountPath": f"{CONFIG_DIR}/tls", "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _pod_name() -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": "metadata.name"}}


def _service_names(name: str, namespace: str) -> list[str]:
    """The names a Service ``name`` is reached by in the cluster."""
    return [
        name,
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.cluster.local",
    ]


def _workload(
    settings: Settings,
    name: str,
    member: Member,
    replicas: int,
    stateful: bool,
    static: bool,
    image: str,
    meta: dict[str, str],
) -> Manifest:
    labels = _labels(name)
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": f"{APP}-config"}},
        {"name": "tls", "secret": {"secretName": f"{APP}-tls", "optional": True}},
        {"name": "tmp", "emptyDir": {}},
    ]
    keeps_tables = member.argv[0] == "analytics-rollup"
    if not keeps_tables:
        volumes.append({"name": "state", "emptyDir": {}})
    pod = {
        "metadata": {"labels": labels, "annotations": dict(SCRAPE_ANNOTATIONS)},
        "spec": {
            # The members' own graceful stop (finish the batch, commit, close the archive parts,
            # leave the group) within fleet_stop_timeout_s, then a margin.
            "terminationGracePeriodSeconds": int(settings.fleet_stop_timeout_s) + 5,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "fsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [_container(settings, name, member, static, image, meta["namespace"])],
            "volumes": volumes,
        },
    }
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": pod,
    }
    if stateful:
        spec["serviceName"] = name
        spec["podManagementPolicy"] = "Parallel"
        if keeps_tables:
            spec["volumeClaimTemplates"] = [
                {
                    "metadata": {"name": "state"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "10Gi"}},
                    },
                }
            ]
    elif member.argv[0] == "pump":
        # One at a time: a pump fences the one before. (A publisher needs no such care: a new
        # one waits as a standby until the old one lets its outbox's lock go.)
        spec["strategy"] = {"type": "Recreate"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet" if stateful else "Deployment",
        "metadata": {"name": name, "labels": labels, **meta},
        "spec": spec,
    }


def _disruption_budget(name: str, meta: dict[str, str]) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, **meta},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _labels(name)}},
    }


def _service(settings: Settings, name: str, meta: dict[str, str]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, **meta},
        "spec": {
            "selector": _labels(name),
            "ports": [{"name": "http", "port": settings.operator_port, "targetPort": "http"}],
        },
    }


def _headless_service(name: str, meta: dict[str, str]) -> Manifest:
    """The governing service of a StatefulSet: its pods' stable network names."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, **meta},
        "spec": {
            "clusterIP": "None",
            "selector": _labels(name),
            "ports": [{"name": "probes", "port": PROBE_PORT, "targetPort": "probes"}],
        },
    }


def _scaled_object(
    settings: Settings,
    name: str,
    member: Member,
    replicas: int,
    partitions: int,
    meta: dict[str, str],
) -> Manifest:
    assert member.subscription is not None
    trigger: dict[str, Any] = {
        "type": "kafka",
        "metadata": {
            "bootstrapServers": settings.kafka_bootstrap,
            "consumerGroup": group_id(member.subscription, settings.env),
            # every topic the group has offsets on: its streams (and retry topic)
            "lagThreshold": str(settings.fleet_scale_lag),
            # a process past the partitions would own none
            "allowIdleConsumers": "false",
        },
    }
    if settings.kafka_sasl_mechanism is not None:
        trigger["authenticationRef"] = {"name": f"{APP}-kafka"}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, **meta},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet" if settings.fleet_static_membership else "Deployment",
                "name": name,
            },
            "minReplicaCount": max(replicas, 1),
            "maxReplicaCount": partitions,
            "triggers": [trigger],
        },
    }


def _trigger_authentication(settings: Settings, meta: dict[str, str]) -> Manifest:
    """What KEDA's Kafka scaler logs in to the brokers with: the same Secret as the pods."""
    secret = f"{APP}-secrets"
    refs = [
        {"parameter": "sasl", "name": secret, "key": "KEDA_KAFKA_SASL"},
        {"parameter": "username", "name": secret, "key": "KEDA_KAFKA_USERNAME"},
        {"parameter": "password", "name": secret, "key": "RHUMBATRON_KAFKA_SASL_PASSWORD"},
    ]
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        refs += [
            {"parameter": "tls", "name": secret, "key": "KEDA_KAFKA_TLS"},
            {"parameter": "ca", "name": f"{APP}-tls", "key": "ca.crt"},
        ]
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": {"name": f"{APP}-kafka", **meta},
        "spec": {"secretTargetRef": refs},
    }


def _pod_monitor(meta: dict[str, str]) -> Manifest:
    """The Prometheus Operator's scrape of every pod's /metrics (the probes port): each process's
    own counters, and the operator server's fleet-wide gauges (lag, dead letters, outboxes)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": APP, **meta},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": APP}},
            "podMetricsEndpoints": [
                {
                    "port": "probes",
                    "path": "/metrics",
                    "interval": SCRAPE_INTERVAL,
                    # the workload: the label the dashboards group by, as locally
                    "relabelings": [
                        {
                            "sourceLabels": [
                                "__meta_kubernetes_pod_label_app_kubernetes_io_component"
                            ],
                            "targetLabel": "role",
                        }
                    ],
                }
            ],
        },
    }
