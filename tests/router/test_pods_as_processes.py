"""The manifests, run: every container of every workload ``rhumbatron fleet manifests`` renders
from a deployment like the shipped one (infra/deploy/config.toml) is started as a local process
the way the kubelet would start it — its ``args`` after the image's entrypoint, its ``env`` (the
pod's name from ``fieldRef``), its ``envFrom`` (the Secret's keys as variables), its volumes (the
ConfigMap's file, emptyDirs, the rollup's claim) as directories — against the local Kafka, Redis,
PostgreSQL and an S3 server. Only addresses, ports and mount paths are substituted (a single
broker: replication factor 1 and plaintext; the local Redis without TLS); the workloads, their
command lines and their settings are the renderer's, so a workload it adds later is run here too.

Checked, as a cluster would hold them:
- each pod becomes ready on its readiness probe within the budget its liveness probe gives it
  (``initialDelaySeconds + failureThreshold x periodSeconds``: Kubernetes gives readiness no
  deadline, a pod that never becomes ready is one that never serves);
- the operator server answers through its Service's names (and still refuses another Host);
- a workload written to the outbox flows end to end: every project's view, commands handled by
  the workers, metric points, and after the stop every event in a closed archive part;
- a real Prometheus scraping the pods where their annotations say finds every series each alert
  rule judges;
- a wedged consume loop (a fail-point) fails the liveness probe while the process still runs;
- SIGTERM stops every pod cleanly within its ``terminationGracePeriodSeconds``.
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from pydantic import SecretStr

from router import deploy
from router.settings import Settings, settings_elsewhere
from router.wiring.archive import archived_events
from router.wiring.outbox import open_outbox
from router.wiring.provisioning import provision_environment
from streams.topology import metrics_topic
from streams.workload import project_ids, workload, write_workload
from tests.infra.test_dashboards import ALERT_COUNT, alert_query
from tests.support.deployment import deployment_config
from tests.support.environment import TEST_KAFKA, TEST_REDIS, cleanup_environment, run_cli
from tests.support.postgres import FreshSchema
from tests.support.prometheus import Prometheus, Target, free_port, running_prometheus, wait_for
from tests.support.receiver import Receiver, Reply, receiving
from tests.support.s3proxy import create_bucket, s3proxy

pytestmark = pytest.mark.integration

NAMESPACE = "rhumbatron"
PROJECTS, EVENTS = 6, 120
SECRET = f"{deploy.APP}-secrets"
OPERATOR_TOKEN = "pods-operator-token-" + "x" * 16
ENTRYPOINT = Path(sys.executable).with_name("rhumbatron")  # the image's ENTRYPOINT
# Settings a pod's process reads on a port of its own that its container does not list: each
# process here gets a free one (in a pod, nothing else listens beside it).
PORT_SETTINGS = ("RHUMBATRON_ANALYTICS_ROLLUP_PORT",)
SERIES_TIMEOUT_S = 90.0
HANDLER_KEY = bytes(range(32))
FLOW_TIMEOUT_S = 120.0


@dataclass
class Pod:
    """One replica of a workload, as the kubelet runs it: here, a process."""

    name: str
    workload: dict[str, Any]
    root: Path
    ports: dict[int, int] = field(default_factory=dict)  # containerPort -> the local port
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    @property
    def spec(self) -> dict[str, Any]:
        pod: dict[str, Any] = self.workload["spec"]["template"]["spec"]
        return pod

    @property
    def container(self) -> dict[str, Any]:
        (container,) = self.spec["containers"]
        found: dict[str, Any] = container
        return found

    @property
    def grace_s(self) -> int:
        return int(self.spec["terminationGracePeriodSeconds"])

    def port(self, name: str) -> int:
        """The local port of the container's port ``name``."""
        (number,) = [p["containerPort"] for p in self.container["ports"] if p["name"] == name]
        return self.ports[number]

    def get(self, probe: dict[str, Any]) -> int | None:
        """The status a probe's GET answers, or None when nothing answers in its timeout."""
        http = probe["httpGet"]
        url = f"http://127.0.0.1:{self.port(http['port'])}{http['path']}"
        try:
            return httpx.get(url, timeout=probe.get("timeoutSeconds", 1)).status_code
        except httpx.HTTPError:
            return None

    def log(self) -> str:
        path = self.root / "log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def probe_budget_s(probe: dict[str, Any]) -> int:
    """How long a probe lets a container go unanswered from its start (Kubernetes' defaults for
    what the manifest leaves out)."""
    delay = int(probe.get("initialDelaySeconds", 0))
    return delay + int(probe.get("failureThreshold", 3)) * int(probe.get("periodSeconds", 10))


class Kubelet:
    """Starts the manifests' containers as processes: the ConfigMaps and Secrets resolved as the
    kubelet resolves them, each volume a directory, each mount path and listed port substituted."""

    def __init__(self, root: Path, docs: list[dict[str, Any]], secrets: Mapping[str, str]) -> None:
        self.root = root
        self.config_maps = {
            d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"
        }
        self.secrets = {SECRET: dict(secrets)}

    def pod(self, workload: dict[str, Any], name: str | None = None) -> Pod:
        base = workload["metadata"]["name"]
        if name is None:  # a StatefulSet's first pod, or a Deployment's with its hash
            name = (
                f"{base}-0"
                if workload["kind"] == "StatefulSet"
                else f"{base}-5c9d8-{secrets.token_hex(3)[:5]}"
            )
        return Pod(name, workload, self.root / name)

    def start(self, pod: Pod, **extra_env: str) -> None:
        pod.root.mkdir(parents=True, exist_ok=True)  # a restarted container: the same pod
        mounts = self._mounts(pod)
        pod.ports = {p["containerPort"]: free_port() for p in pod.container["ports"]}
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(pod.root / "home"),
            "LANG": "C.UTF-8",
            "TMPDIR": mounts.get("/tmp", str(pod.root / "tmp")),
        }
        for source in pod.container.get("envFrom", []):
            env.update(self._env_from(source))
        for var in pod.container.get("env", []):
            env[var["name"]] = self._value(pod, var)
        for name, value in env.items():
            for mount, local in mounts.items():
                if value == mount or value.startswith(mount + "/"):
                    env[name] = local + value[len(mount) :]
            if value.isdigit() and int(value) in pod.ports:
                env[name] = str(pod.ports[int(value)])
        if "http" in {p["name"] for p in pod.container["ports"]}:
            env["RHUMBATRON_OPERATOR_PORT"] = str(pod.port("http"))
        env.update({name: str(free_port()) for name in PORT_SETTINGS})
        env.update(extra_env)
        log = (pod.root / "log").open("ab")
        pod.proc = subprocess.Popen(
            [str(ENTRYPOINT), *pod.container["args"]],
            cwd=mounts.get(deploy.STATE_DIR, str(pod.root)),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        pod.started = time.monotonic()

    def _mounts(self, pod: Pod) -> dict[str, str]:
        volumes = {v["name"]: v for v in pod.spec["volumes"]}
        claims = {
            c["metadata"]["name"] for c in pod.workload["spec"].get("volumeClaimTemplates", [])
        }
        out = {}
        for mount in pod.container["volumeMounts"]:
            local = pod.root / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            volume = volumes.get(mount["name"])
            if volume is None:
                assert mount["name"] in claims, f"{pod.name}: no volume {mount['name']!r}"
            elif "configMap" in volume:
                for key, text in self.config_maps[volume["configMap"]["name"]].items():
                    (local / key).write_text(text)
            elif "secret" in volume:
                assert volume["secret"].get("optional"), volume  # none here: the TLS files
            else:
                assert "emptyDir" in volume, f"{pod.name}: volume {volume} not understood"
            out[mount["mountPath"]] = str(local)
        return out

    def _env_from(self, source: dict[str, Any]) -> dict[str, str]:
        if "secretRef" in source:
            found = self.secrets.get(source["secretRef"]["name"])
        else:
            found = self.config_maps.get(source["configMapRef"]["name"])
        assert found is not None or next(iter(source.values())).get("optional"), source
        return dict(found or {})

    def _value(self, pod: Pod, var: dict[str, Any]) -> str:
        if "value" in var:
            return str(var["value"])
        ref = var["valueFrom"]
        if ref.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            return pod.name
        if "secretKeyRef" in ref:
            key = ref["secretKeyRef"]
            return self.secrets[key["name"]][key["key"]]
        raise AssertionError(f"{pod.name}: env {var} is not one this kubelet resolves")


def _without_password(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    netloc = f"{parts.username}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc)), parts.password or ""


@dataclass
class Deployment:
    settings: Settings  # what the pods read, with the Secret's values
    docs: list[dict[str, Any]]
    kubelet: Kubelet
    outbox_url: str  # with its password: the writers'
    receiver: Receiver  # the service the integration queue's worker POSTs to


def _accept(body: dict[str, object], headers: dict[str, str]) -> Reply:
    return 200, {}, b""


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    env = "t" + secrets.token_hex(5)
    with ExitStack() as stack:
        s3 = stack.enter_context(s3proxy(tmp_path / "s3"))
        bucket = f"rh-{env}"
        create_bucket(s3, bucket, region="eu-west-1")
        receiver = stack.enter_context(receiving([HANDLER_KEY], _accept))
        schema = FreshSchema()
        stack.callback(schema.drop)
        outbox, password = _without_password(schema.url)
        path = deployment_config(
            tmp_path,
            env=env,
            kafka_bootstrap=TEST_KAFKA,
            kafka_security_protocol=None,
            kafka_sasl_mechanism=None,
            kafka_sasl_username=None,
            kafka_ssl_ca_file=None,
            replication_factor=1,
            redis_url=TEST_REDIS,
            redis_username=None,
            redis_ssl_ca_file=None,
            router_outbox_path=outbox,
            fleet_outboxes=[outbox],
            archive_s3_endpoint=s3.endpoint,
            archive_s3_bucket=bucket,
            # the commands the workload makes, handled (the shipped file names no workers): one
            # queue by a handler in the image, one by a service the worker POSTs to
            fleet_workers={"agent-wakeups": "ok", "integration": receiver.url},
        )
        secret = {
            "PGPASSWORD": password,
            "RHUMBATRON_OPERATOR_TOKEN": OPERATOR_TOKEN,
            "RHUMBATRON_ARCHIVE_S3_ACCESS_KEY": s3.identity,
            "RHUMBATRON_ARCHIVE_S3_SECRET_KEY": s3.credential,
            "RHUMBATRON_HTTP_HANDLER_SECRETS": "whsec_" + base64.b64encode(HANDLER_KEY).decode(),
        }
        rendered = settings_elsewhere(path)
        docs = deploy.manifests(
            rendered, path.read_text(), image="rhumbatron:test", namespace=NAMESPACE
        )
        settings = rendered.model_copy(
            update={
                "archive_s3_access_key": SecretStr(s3.identity),
                "archive_s3_secret_key": SecretStr(s3.credential),
            }
        )
        provision_environment(settings)
        stack.callback(cleanup_environment, settings)
        yield Deployment(
            settings, docs, Kubelet(tmp_path / "pods", docs, secret), schema.url, receiver
        )


def _workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def _wait_ready(pods: list[Pod]) -> None:
    """Each pod ready on its readiness probe within what its liveness probe allows."""
    waiting = list(pods)
    while waiting:
        for pod in list(waiting):
            assert pod.proc is not None
            budget = probe_budget_s(pod.container["livenessProbe"])
            if pod.proc.poll() is not None:
                raise AssertionError(
                    f"pod {pod.name} ({' '.join(pod.container['args'])}) exited "
                    f"{pod.proc.returncode} before it was ready:\n{pod.log()}"
                )
            if pod.get(pod.container["readinessProbe"]) == 200:
                waiting.remove(pod)
                print(f"{pod.name}: ready in {time.monotonic() - pod.started:.1f} s")
            elif time.monotonic() - pod.started > budget:
                raise AssertionError(
                    f"pod {pod.name} not ready within {budget} s (its liveness budget):\n{pod.log()}"
                )
        time.sleep(0.25)


def _operator(pods: list[Pod], host: str) -> httpx.Client:
    (server,) = [p for p in pods if p.container["args"][0] == "serve"]
    return httpx.Client(
        base_url=f"http://127.0.0.1:{server.port('http')}",
        headers={"Host": host, "Authorization": f"Bearer {OPERATOR_TOKEN}"},
        timeout=10,
    )


def _views_complete(client: httpx.Client, env: str) -> bool | None:
    per = EVENTS // PROJECTS
    for project in project_ids(env, PROJECTS):
        reply = client.get(f"/api/projects/{project}/view")
        if reply.status_code != 200 or reply.json()["events"] != per:
            return None
    return True


def _log_end(s: Settings, topic: str) -> int:
    """The records written to ``topic``, over its partitions (their high watermarks)."""
    consumer = Consumer({**s.kafka_config(), "group.id": f"{s.env}-peek"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(s.partitions)
        )
    finally:
        consumer.close()


def _has(prometheus: Prometheus, expr: str) -> bool | None:
    return True if prometheus.query(expr) else None


def test_every_pod_of_the_manifests_runs_serves_and_stops_as_its_probes_and_grace_say(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    s = d.settings
    pods = [d.kubelet.pod(w) for w in _workloads(d.docs)]
    assert {p.container["args"][0] for p in pods} >= {
        "publish", "consume", "worker", "dead-letter-consumer", "analytics-rollup", "serve"
    }  # fmt: skip
    try:
        for pod in pods:
            d.kubelet.start(pod)
        _wait_ready(pods)

        # The operator server through its Service: the cluster's names answer, another is refused.
        service = f"operator-server.{NAMESPACE}.svc.cluster.local:{s.operator_port}"
        with _operator(pods, service) as api:
            assert api.get("/api/info").status_code == 200
        with _operator(pods, "rebound.example") as api:
            assert api.get("/api/info").status_code == 421

        # A workload through the outbox, end to end.
        store = open_outbox(s, d.outbox_url, create=False)
        try:
            write_workload(store, workload(s.env, PROJECTS, EVENTS), writers=2, events_per_write=4)
        finally:
            store.close()
        # A record no subscription can read: a dead letter, which an alert judges.
        run_cli(s, "produce", "--drill", "garbage", check=True)
        with _operator(pods, f"operator-server.{NAMESPACE}") as api:
            wait_for("every project's view", lambda: _views_complete(api, s.env), FLOW_TIMEOUT_S)
        points = metrics_topic(s.env)
        wait_for(
            "the analytics projector's points",
            lambda: True if _log_end(s, points) > 0 else None,
            FLOW_TIMEOUT_S,
        )

        # Prometheus scraping where the pods' annotations say: every alert rule's series.
        targets = []
        for pod in pods:
            notes = pod.workload["spec"]["template"]["metadata"]["annotations"]
            assert (
                notes["prometheus.io/scrape"] == "true"
                and notes["prometheus.io/path"] == "/metrics"
            )
            port = pod.ports[int(notes["prometheus.io/port"])]
            targets.append(Target("rhumbatron-pods", f"127.0.0.1:{port}", {"pod": pod.name}))
        with running_prometheus(tmp_path / "prometheus", targets) as prometheus:
            wait_for(
                "the workers' handled commands",
                lambda: _has(prometheus, 'rhumbatron_worker_total{counter="ok"} > 0'),
                SERIES_TIMEOUT_S,
            )
            wait_for(
                "the service the integration worker POSTs to to be called, signed",
                lambda: True if any(seen.signed for seen in d.receiver.seen) else None,
                SERIES_TIMEOUT_S,
            )
            judged = {
                ('up{job=~"rhumbatron.*"}' if metric == "up" else metric): rule["name"]
                for rule in prometheus.rules()
                for metric in alert_query(rule).metrics
            }
            assert len(set(judged.values())) == ALERT_COUNT
            missing = dict(judged)

            def every_series() -> bool | None:
                for series in list(missing):
                    if prometheus.query(series):
                        del missing[series]
                return True if not missing else None

            try:
                wait_for("every alert rule's series", every_series, SERIES_TIMEOUT_S)
            except AssertionError:
                raise AssertionError(f"series no pod serves (series: alert): {missing}") from None

    except BaseException:
        for pod in pods:
            if pod.proc is not None and pod.proc.poll() is None:
                pod.proc.kill()
        raise

    # SIGTERM, as the kubelet sends it: each pod gone cleanly within its grace period.
    for pod in pods:
        assert pod.proc is not None
        pod.proc.send_signal(signal.SIGTERM)
    asked = time.monotonic()
    for pod in pods:
        assert pod.proc is not None
        left = pod.grace_s - (time.monotonic() - asked)
        try:
            code = pod.proc.wait(max(left, 0.1))
        except subprocess.TimeoutExpired:
            for each in pods:
                assert each.proc is not None
                each.proc.kill()
            raise AssertionError(
                f"pod {pod.name} still running after {pod.grace_s} s:\n{pod.log()}"
            ) from None
        assert code == 0, f"pod {pod.name} exited {code}:\n{pod.log()}"
    assert archived_events(s) == EVENTS  # every part closed at the stop, every event in one

    # A wedged consume loop: the process still runs, its liveness probe fails. (Run once the
    # others have stopped: a static member killed mid-rebalance holds its group's rebalance for
    # session_timeout_ms, and a neighbour stopped meanwhile waits for it past its grace.)
    projector = next(
        w for w in _workloads(d.docs) if w["metadata"]["name"] == "project-view-projector"
    )
    wedged = d.kubelet.pod(projector, "project-view-projector-9")
    d.kubelet.start(
        wedged, RHUMBATRON_FAILPOINTS="consume.tick@5:hang", RHUMBATRON_HEALTH_STALE_S="3"
    )
    assert wedged.proc is not None
    try:
        liveness = wedged.container["livenessProbe"]
        wait_for(
            "the wedged pod to have been live",
            lambda: True if wedged.get(liveness) == 200 else None,
        )
        wait_for(
            "the wedged pod's liveness probe to fail",
            lambda: True if wedged.get(liveness) == 503 else None,
            3 + probe_budget_s(liveness),
        )
        assert wedged.proc.poll() is None, wedged.log()  # wedged, not dead
    finally:
        # What the kubelet does once the probe has failed failureThreshold times.
        wedged.proc.kill()
        wedged.proc.wait(30)
