"""The Helm chart (infra/deploy/helm/rhumbatron) renders what ``rhumbatron fleet manifests``
renders: for each row of a matrix of values, ``helm template`` (Helm built by ``infra/local.sh
helm``) gives the chart's objects and its ConfigMap's config.toml; router.deploy renders that
file (read alone, as the command reads it); the two lists are the same objects, in the same
order once the renderer's is put in the order Helm applies a release in. ``helm lint --strict``
passes, the chart's defaults are the shipped deployment (infra/deploy/config.toml), and values
the chart cannot honour are refused by Helm naming the value.

Slow: Helm is a binary built from source on a fresh machine (`make test-slow` builds it)."""

from __future__ import annotations

import difflib
import os
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from router import deploy
from router.settings import Settings, settings_elsewhere
from tests.support.environment import ROOT

pytestmark = pytest.mark.slow

HELM_VERSION = "4.3.2"  # infra/local.sh's HELM_VERSION
HELM = ROOT / ".local" / "helm" / HELM_VERSION / "helm"
CHART = ROOT / "infra" / "deploy" / "helm" / "rhumbatron"
SHIPPED = ROOT / "infra" / "deploy" / "config.toml"
NAMESPACE = "team-a"
REPOSITORY, TAG = "registry.example/rhumbatron", "1.2.3"
# Helm applies a release's objects sorted by kind, keeping the chart's order within a kind; a
# kind it does not know (the CRDs' ScaledObject, TriggerAuthentication, PodMonitor) goes after
# every kind it knows, those sorted by name. These are the kinds it knows that the chart has, in
# its order.
HELM_KIND_ORDER = (
    "Namespace",
    "PodDisruptionBudget",
    "ConfigMap",
    "Service",
    "Deployment",
    "StatefulSet",
)

Doc = dict[str, Any]
Key = tuple[str, str]

SCRAM_PLAINTEXT = {
    "kafka": {
        "bootstrap": "kafka:9092",
        "securityProtocol": "SASL_PLAINTEXT",
        "saslMechanism": "SCRAM-SHA-256",
        "saslUsername": "router",
        "sslCaFile": "",
    }
}
NO_SASL = {
    "kafka": {
        "bootstrap": "kafka:9092",
        "securityProtocol": "PLAINTEXT",
        "saslMechanism": "",
        "saslUsername": "",
        "sslCaFile": "",
    },
    "redis": {"url": "redis://redis:6379/0", "username": "", "sslCaFile": ""},
}
OUTBOXES = {
    "outboxes": [
        "postgresql://writer@orders-db:5432/orders",
        "postgresql://rhumbatron@postgres:5432/rhumbatron",
        "postgres://writer@billing-db/billing",
        "postgresql://writer@orders-db:5432/orders",  # twice: one publisher
    ]
}
WORKERS = {
    "workers": {
        "payments": "router.workers.drills:OkHandler",
        "integration": "https://hooks.example.com/commands",
        "indexing": "ok",
    },
    "settings": {"session_timeout_ms": 45000, "queues": {"payments": {"retries": 5}}},
}
# name -> values laid over the chart's defaults (the shipped deployment)
MATRIX: dict[str, dict[str, Any]] = {
    "shipped": {},
    "dynamic membership": {"staticMembership": False},
    "SCRAM without TLS": SCRAM_PLAINTEXT,
    "no SASL": NO_SASL,
    "no SASL, dynamic membership": {**NO_SASL, "staticMembership": False},
    "several outboxes": OUTBOXES,
    "the router's outbox not published": {
        "outboxes": ["postgresql://writer@orders-db:5432/orders"],
    },
    "workers, one process each": WORKERS,
    "workers, three processes each": {**WORKERS, "workerProcesses": 3},
    "no rollup": {"analyticsRollup": {"enabled": False}},
    "KEDA off": {"keda": {"enabled": False, "lagThreshold": 500}},
    "KEDA off, SASL on": {"keda": {"enabled": False, "lagThreshold": 10000}, **SCRAM_PLAINTEXT},
    "pod monitor off": {"podMonitor": {"enabled": False}},
    "pump, no dead-letter consumer, allowed hosts": {
        "pump": {"feed": "https://feed.example.com/events"},
        "deadLetterConsumer": {"enabled": False},
        "operator": {"enabled": True, "port": 9443, "allowedHosts": ["ops.example.com"]},
    },
    "no operator server, no archive": {
        "operator": {"enabled": False, "port": 8642},
        "archive": {"store": "none"},
        "subscriptions": {"audit-archiver": {"processes": 0}},
    },
    "sizes": {
        "subscriptions": {"project-view-projector": {"processes": 32}, "ledger": {"processes": 3}},
        "streams": 4,
        "partitions": 8,
        "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "stopTimeoutSeconds": 12.5,
        "image": {"repository": REPOSITORY, "tag": TAG, "pullPolicy": ""},
    },
}


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Helm's own folders in a temporary one: nothing of the user's Helm (repositories,
    plugins, registry logins) is read, and nothing is written under $HOME."""
    assert HELM.exists(), f"{HELM} is missing: run `infra/local.sh helm` (or `make helm`)"
    home = tmp_path_factory.mktemp("helm-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    for name in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{name}_HOME"] = str(home / name.lower())
    yield env


def _helm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HELM), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _values_file(folder: Path, values: dict[str, Any]) -> Path:
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump({"image": {"repository": REPOSITORY, "tag": TAG}, **values}))
    return path


def _template(env: dict[str, str], values: Path) -> list[Doc]:
    done = _helm(env, "template", "rhumbatron", str(CHART), "-n", NAMESPACE, "-f", str(values))
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def _key(doc: Doc) -> Key:
    return doc["kind"], doc["metadata"]["name"]


def _helm_order(docs: list[Doc]) -> list[Doc]:
    def rank(doc: Doc) -> tuple[int, int, str]:
        kind = doc["kind"]
        if kind in HELM_KIND_ORDER:
            return 0, HELM_KIND_ORDER.index(kind), ""
        return 1, 0, kind

    return sorted(docs, key=rank)  # stable: the renderer's order within a kind


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors: the renderer shares one labels map between places."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _yaml(doc: Doc) -> list[str]:
    return yaml.dump(doc, Dumper=_PlainDumper, width=200).splitlines()


def _differences(chart: list[Doc], rendered: list[Doc]) -> str:
    """What differs, readably: the objects only one side has, each object that differs as a
    diff of its YAML, and the order."""
    ours, theirs = {_key(d): d for d in chart}, {_key(d): d for d in rendered}
    lines = []
    for key in theirs.keys() - ours.keys():
        lines.append(f"the chart lacks {key[0]} {key[1]}")
    for key in ours.keys() - theirs.keys():
        lines.append(f"the chart has {key[0]} {key[1]}, which the renderer does not render")
    for key in ours.keys() & theirs.keys():
        if ours[key] != theirs[key]:
            lines.append(f"{key[0]} {key[1]} differs (- renderer, + chart):")
            lines += difflib.unified_diff(
                _yaml(theirs[key]),
                _yaml(ours[key]),
                lineterm="",
                n=2,
            )
    order = [_key(d) for d in chart]
    if not lines and order != [_key(d) for d in rendered]:
        lines.append("the order differs (- renderer, + chart):")
        lines += difflib.unified_diff(
            [" ".join(k) for k in map(_key, rendered)],
            [" ".join(k) for k in order],
            lineterm="",
            n=1,
        )
    return "\n".join(lines)


def _config_toml(docs: list[Doc]) -> str:
    (config,) = [d for d in docs if _key(d) == ("ConfigMap", "rhumbatron-config")]
    text = config["data"]["config.toml"]
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize("values", MATRIX.values(), ids=MATRIX.keys())
def test_the_chart_renders_what_the_renderer_renders(
    helm_env: dict[str, str], tmp_path: Path, values: dict[str, Any]
) -> None:
    chart = _template(helm_env, _values_file(tmp_path, values))
    settings_file = tmp_path / "config.toml"
    settings_file.write_text(_config_toml(chart))
    # The settings ignore a key they do not know: a misspelt one would pass for its default.
    unknown = set(tomllib.loads(settings_file.read_text())) - set(Settings.model_fields)
    assert not unknown, f"the chart writes settings that do not exist: {sorted(unknown)}"
    rendered = deploy.manifests(
        settings_elsewhere(settings_file),
        settings_file.read_text(),
        image=f"{REPOSITORY}:{TAG}",
        namespace=NAMESPACE,
    )
    assert rendered[0]["kind"] == "Namespace"  # the chart leaves it to --create-namespace
    rendered = _helm_order(rendered[1:])
    differences = _differences(chart, rendered)
    assert not differences, "\n" + differences
    assert {_key(d): d for d in chart} == {_key(d): d for d in rendered}
    assert [_key(d) for d in chart] == [_key(d) for d in rendered]


def test_the_charts_defaults_are_the_shipped_deployment(
    helm_env: dict[str, str], tmp_path: Path
) -> None:
    chart = _template(helm_env, _values_file(tmp_path, {}))
    settings_file = tmp_path / "config.toml"
    settings_file.write_text(_config_toml(chart))
    assert settings_elsewhere(settings_file) == settings_elsewhere(SHIPPED)


def test_helm_lint_is_clean(helm_env: dict[str, str], tmp_path: Path) -> None:
    for name, values in MATRIX.items():
        done = _helm(
            helm_env,
            "lint",
            "--strict",
            str(CHART),
            "-n",
            NAMESPACE,
            "-f",
            str(_values_file(tmp_path, values)),
        )
        assert done.returncode == 0, f"{name}:\n{done.stdout}{done.stderr}"
        assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"unknown": 1}, "additional properties 'unknown' not allowed"),
        ({"outboxes": ["outbox.sqlite"]}, "outboxes/0"),
        ({"outboxes": ["postgresql://u:secret@db/rhumbatron"]}, "PGPASSWORD"),
        ({"archive": {"store": "local"}}, "archive/store"),
        ({"settings": {"partitions": 2}}, "settings.partitions: the chart writes this setting"),
        ({"settings": {"redis_password": "x"}}, "RHUMBATRON_REDIS_PASSWORD"),
        (
            {"subscriptions": {"ledger": {"processes": 33}}},
            "subscriptions.ledger.processes: 33: must be 0 to 32",
        ),
        ({"resources": {"requests": {"cpu": "lots", "memory": "1Gi"}}}, "resources/requests/cpu"),
        ({"workerProcesses": 0}, "workerProcesses"),
        (NO_SASL | {"kafka": {**NO_SASL["kafka"], "saslUsername": "router"}}, "SASL only"),
        ({"kafka": {**SCRAM_PLAINTEXT["kafka"], "sslCaFile": "/ca.crt"}}, "TLS only"),
        ({"kafka": {**SCRAM_PLAINTEXT["kafka"], "saslMechanism": ""}}, "needs kafka.saslMech"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_values_the_chart_cannot_honour_are_refused_naming_them(
    helm_env: dict[str, str], tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    done = _helm(
        helm_env, "template", "rhumbatron", str(CHART), "-f", str(_values_file(tmp_path, values))
    )
    assert done.returncode != 0, done.stdout
    assert named in done.stderr, done.stderr


def test_whole_numbers_stay_whole_in_the_settings_file(
    helm_env: dict[str, str], tmp_path: Path
) -> None:
    """A values file's numbers reach Helm as floats; the settings file has them as written."""
    settings = {
        "session_timeout_ms": 45000,
        "retry_tiers_s": [30, 300],
        "archive_part_max_age_s": 90.5,
        "queues": {"payments": {"retries": 5}},
    }
    chart = _template(helm_env, _values_file(tmp_path, {"settings": settings}))
    lines = [line.strip() for line in _config_toml(chart).splitlines()]
    assert "session_timeout_ms = 45000" in lines
    assert "retry_tiers_s = [30, 300]" in lines
    assert "retries = 5" in lines  # in [queues.payments]
    assert "archive_part_max_age_s = 90.5" in lines
    assert "partitions = 4" in lines
    assert "fleet_stop_timeout_s = 30.0" in lines
