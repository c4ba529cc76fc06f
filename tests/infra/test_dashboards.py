"""The shipped dashboards, alert rules and Prometheus configuration (infra/dashboards/): promtool
accepts the rules and the configuration (and refuses a broken copy); both dashboards are valid
JSON on the provisioned data sources' uids; every panel query and every alert expression parses in
a real Prometheus; and, against a real run on the real broker scraped by Debian's prometheus, each
returns series carrying the labels its panel's legend or its alert's annotations use.

Grafana and Tempo are not run here (they cannot be installed on this machine): the dashboards'
rendering and the traces dashboard's TraceQL are not executed."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.settings import Settings
from streams import tracing
from streams.envelopes import Event
from tests.support.causal_router import History
from tests.support.environment import ROOT, subprocess_env
from tests.support.prometheus import (
    ALERT_RULES,
    DASHBOARDS,
    Prometheus,
    QueryError,
    Target,
    free_port,
    promtool,
    running_prometheus,
    wait_for,
)
from tests.support.receiver import Reply, receiving

# The catalog's metrics each long-running process serves on its own endpoint (metrics_port).
PER_PROCESS = frozenset(
    {
        "rhumbatron_events_applied_total",
        "rhumbatron_events_duplicate_total",
        "rhumbatron_events_filtered_total",
        "rhumbatron_batch_failures_total",
        "rhumbatron_dead_lettered_total",
        "rhumbatron_fenced_total",
        "rhumbatron_parked_projects",
        "rhumbatron_end_to_end_latency_seconds",
        "rhumbatron_publish_latency_seconds",
        "rhumbatron_outbox_published_total",
        "rhumbatron_commands_total",
        "rhumbatron_commands_capped_total",
        "rhumbatron_classifier_calls_total",
        "rhumbatron_worker_attempts_total",
        "rhumbatron_false_wakeups_total",
        "rhumbatron_handler_auth_failures_total",
    }
)
# The operator server's fleet-wide ones (rhumbatron serve's /metrics).
FLEET = frozenset(
    {
        "rhumbatron_consumer_lag",
        "rhumbatron_outbox_rows",
        "rhumbatron_outbox_held_projects",
        "rhumbatron_outbox_oldest_pending_seconds",
        "rhumbatron_dead_letters",
        "rhumbatron_worker_total",
        "rhumbatron_scrape_error",
    }
)

METRICS_DASHBOARD = DASHBOARDS / "rhumbatron-metrics.json"
TRACES_DASHBOARD = DASHBOARDS / "rhumbatron-traces.json"
PROVISIONING = DASHBOARDS / "grafana" / "provisioning"
ALERT_COUNT = 10
# Grafana's variables as the live test sets them: every subscription, and a rate window of several
# scrapes at the test's 1 s interval (Grafana's $__rate_interval is at least four scrapes).
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$subscription": ".*"}
# A comparison with a number: an alert's threshold, taken out to see the series it judges.
THRESHOLD = re.compile(r"\s*(?:==|!=|>=|<=|>|<)\s*-?[0-9][0-9.e+]*\b")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
ANNOTATION_LABEL = re.compile(r"\$labels\.(\w+)")
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\((\w+),\s*(\w+)\)")


@dataclass(frozen=True)
class Query:
    """One expression a dashboard panel or an alert runs, and the labels its series must carry."""

    where: str
    expr: str
    labels: frozenset[str]

    @property
    def metrics(self) -> set[str]:
        names = set(re.findall(r"\brhumbatron_[a-z_]+", self.expr)) or {"up"}
        return {n.removesuffix("_bucket") for n in names}


def _grafana(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def _grouping(expr: str) -> set[str]:
    return {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")} - {
        "le",
        "",
    }


def _dashboard(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def panel_queries() -> list[Query]:
    return [
        Query(
            f"panel {panel['title']!r} {target['refId']}",
            _grafana(target["expr"]),
            frozenset(LEGEND_LABEL.findall(target["legendFormat"])),
        )
        for panel in _panels(_dashboard(METRICS_DASHBOARD))
        for target in panel["targets"]
    ]


def alert_query(rule: dict[str, Any]) -> Query:
    """An alert's expression as Prometheus parsed it, its thresholds taken out; its series must
    carry the labels its annotations name and those it groups by."""
    return Query(
        f"alert {rule['name']}",
        THRESHOLD.sub("", rule["query"]),
        frozenset(ANNOTATION_LABEL.findall(" ".join(rule["annotations"].values())))
        | _grouping(rule["query"]),
    )


# -- promtool (Debian's, which infra/local.sh installs: these run with the integration tests) ------
@pytest.mark.integration
def test_promtool_accepts_the_alert_rules_and_refuses_a_broken_copy(tmp_path: Path) -> None:
    checked = promtool("check", "rules", ALERT_RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {ALERT_COUNT} rules found" in checked.stdout

    text = ALERT_RULES.read_text()
    broken = tmp_path / "alerts.yml"
    broken.write_text(text.replace("rhumbatron_outbox_oldest_pending_seconds) > 300", ") > 300"))
    assert broken.read_text() != text
    refused = promtool("check", "rules", broken)
    assert refused.returncode != 0
    assert "parse error" in refused.stdout + refused.stderr


@pytest.mark.integration
def test_promtool_accepts_the_shipped_prometheus_configuration() -> None:
    checked = promtool("check", "config", DASHBOARDS / "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {ALERT_COUNT} rules found" in checked.stdout  # it loads alerts.yml


# -- the Kubernetes variant (Debian's prometheus is built without Kubernetes discovery, so its
# promtool cannot load it: its relabeling is run here on the targets discovery would give) --------
def _relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus' relabeling (the ``keep`` and ``replace`` actions) of one target; None: dropped."""
    out = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(out.get(n, "") for n in rule["source_labels"])
        found = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if found is None:
                return None
        elif action == "replace":
            if found is not None:
                replacement = re.sub(r"\$(\d+)", r"\\\1", rule.get("replacement", "$1"))
                out[rule["target_label"]] = found.expand(replacement)
        else:
            raise AssertionError(f"relabel action {action!r} is not one this test runs")
    return out


def _discovered(pod: dict[str, Any], name: str, ip: str) -> list[dict[str, str]]:
    """What Kubernetes pod discovery gives for a pod: one target per declared container port."""
    meta = {"__meta_kubernetes_pod_name": name, "__meta_kubernetes_namespace": "rhumbatron"}
    for key, value in pod["metadata"].get("labels", {}).items():
        meta[f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"] = value
    for key, value in pod["metadata"].get("annotations", {}).items():
        meta[f"__meta_kubernetes_pod_annotation_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"] = value
    ports = [p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])]
    return [
        {**meta, "__address__": f"{ip}:{port}", "__metrics_path__": "/metrics"} for port in ports
    ]


def test_the_kubernetes_variant_scrapes_each_pod_where_its_annotations_say() -> None:
    from router import deploy
    from router.settings import settings_elsewhere
    from tests.support.deployment import CONFIG

    config = yaml.safe_load((DASHBOARDS / "prometheus-kubernetes.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert re.fullmatch("rhumbatron.*", job["job_name"])  # what the RhumbatronDown alert reads
    rules = job["relabel_configs"]
    docs = deploy.manifests(settings_elsewhere(CONFIG), CONFIG.read_text(), image="r:1")
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert workloads
    for n, workload in enumerate(workloads):
        pod = workload["spec"]["template"]
        name = workload["metadata"]["name"]
        kept = [
            t
            for t in (_relabel(t, rules) for t in _discovered(pod, f"{name}-0", f"10.0.0.{n}"))
            if t is not None
        ]
        notes = pod["metadata"]["annotations"]
        assert [(t["__address__"], t["__metrics_path__"], t["role"]) for t in kept] == [
            (f"10.0.0.{n}:{notes['prometheus.io/port']}", notes["prometheus.io/path"], name)
        ] * len(kept), kept
        assert kept, f"{name}: not scraped"
    foreign = {
        "metadata": {"labels": {"app": "other"}},
        "spec": {"containers": [{"ports": [{"containerPort": 80}]}]},
    }
    assert all(_relabel(t, rules) is None for t in _discovered(foreign, "other", "10.0.1.1"))


# -- the dashboards and their provisioning ---------------------------------------------------------
def _provisioned_uids() -> set[str]:
    text = (PROVISIONING / "datasources" / "rhumbatron.yml").read_text()
    return set(re.findall(r"^\s*uid:\s*(\S+)\s*$", text, re.MULTILINE))


def test_the_dashboards_are_valid_and_use_the_provisioned_data_sources() -> None:
    uids = _provisioned_uids()
    assert uids == {"rhumbatron-prometheus", "rhumbatron-tempo"}
    provider = (PROVISIONING / "dashboards" / "rhumbatron.yml").read_text()
    assert "path: ${RHUMBATRON_DASHBOARDS}" in provider
    for path, kind in ((METRICS_DASHBOARD, "prometheus"), (TRACES_DASHBOARD, "tempo")):
        dashboard = _dashboard(path)
        assert dashboard["uid"] and dashboard["title"].startswith("Rhumbatron")
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: panel ids repeat"
        for panel in _panels(dashboard):
            assert panel["targets"], f"{path.name}: {panel['title']} has no query"
            for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
                assert source == {"type": kind, "uid": f"rhumbatron-{kind}"}, panel["title"]


def test_each_panel_legend_names_every_label_its_query_groups_by() -> None:
    queries = panel_queries()
    assert len(queries) >= 25
    for query in queries:
        assert _grouping(query.expr) <= query.labels, query
        assert "$" not in query.expr, query  # every Grafana variable is one the tests set


def test_every_catalog_metric_has_a_panel_and_a_line_in_the_docs() -> None:
    shown = set().union(*(q.metrics for q in panel_queries()))
    assert shown >= PER_PROCESS | FLEET, sorted((PER_PROCESS | FLEET) - shown)
    catalog = (ROOT / "docs" / "observability.md").read_text()
    assert all(f"`{name}`" in catalog for name in PER_PROCESS | FLEET)
    # The ports the shipped configuration scrapes are the ones the docs give each process.
    ports = re.findall(r'"127\.0\.0\.1:(\d+)"', (DASHBOARDS / "prometheus.yml").read_text())
    assert len(ports) == 12
    assert all(re.search(rf"\b{port}\b", catalog) for port in ports), ports


def test_the_traces_dashboard_searches_by_the_attributes_the_spans_carry() -> None:
    searched = " ".join(
        t["query"] for p in _panels(_dashboard(TRACES_DASHBOARD)) for t in p["targets"]
    )
    for attribute in (
        tracing.EVENT_ID,
        tracing.PROJECT,
        tracing.OUTCOME,
        tracing.MESSAGING_SYSTEM,
        tracing.BATCH_COUNT,
    ):
        assert f'span."{attribute}"' in searched, attribute
    assert "resource.service.name" in searched
    variables = {v["name"] for v in _dashboard(TRACES_DASHBOARD)["templating"]["list"]}
    assert variables == {"service", "event_id", "project", "trace_id"}


# -- every query parses in a real Prometheus -------------------------------------------------------
@pytest.mark.integration
def test_every_panel_query_and_alert_expression_parses_in_prometheus(tmp_path: Path) -> None:
    with running_prometheus(tmp_path / "prometheus") as prometheus:
        rules = prometheus.rules()
        assert len(rules) == ALERT_COUNT
        assert all(rule["health"] != "err" for rule in rules), rules
        for query in panel_queries() + [alert_query(r) for r in rules]:
            prometheus.query(query.expr)  # a parse error is a QueryError naming the query
        with pytest.raises(QueryError, match="bad_data: .*parse error"):
            prometheus.query("sum by (outbox) (rhumbatron_outbox_rows")


# -- against a real run ----------------------------------------------------------------------------
# Catalog metrics no process produces yet: their panels stay, their queries are skipped here.
NOT_YET_PRODUCED: frozenset[str] = frozenset()
OPERATOR_TOKEN = "dashboards-test-token-0123456789abcdef"
# What the run does, sized to give every panel a series: a workload through an outbox the
# publisher sends, one drill record that fails every attempt and one that never decodes (the
# dead letters), a second outbox left pending (its oldest row's age), caps of one command per
# change and one classifier call a day (capped commands and classifier calls).
PROJECTS, EVENTS = 3, 90
SERIES_TIMEOUT_S = 120.0


def _metrics_settings(tmp: Path) -> Settings:
    from tests.support.environment import make_settings
    from tests.support.runtime_processes import runtime_settings

    return runtime_settings(
        make_settings(),
        state_dir=tmp / "state",
        router_outbox_path=str(tmp / "router-outbox.sqlite"),
        operator_outboxes=[str(tmp / "outbox.sqlite"), str(tmp / "pending-outbox.sqlite")],
        operator_token=OPERATOR_TOKEN,
        commands_per_change_per_day=1,
        classifier_calls_per_day=1,
        batch_retry_backoff_s=0.05,
        batch_retry_backoff_max_s=0.1,
    )


@contextmanager
def scraped_run(tmp: Path) -> Iterator[Prometheus]:
    """A real run on the real broker and Redis, scraped every second by Debian's prometheus: the
    operator server, the publisher, two subscriptions and a command worker, each long-running
    process on a metrics endpoint of its own. Everything runs until the block ends: a process
    that stopped would leave stale series."""
    from tests.support.environment import cleanup_environment, run_cli
    from tests.support.runtime_processes import publish

    s = _metrics_settings(tmp)
    processes: list[subprocess.Popen[str]] = []
    stack = ExitStack()
    try:
        run_cli(s, "provision", check=True)
        run_cli(s, "produce", "--outbox", str(tmp / "outbox.sqlite"), "--projects",
                str(PROJECTS), "--events", str(EVENTS), check=True)  # fmt: skip
        run_cli(s, "produce", "--outbox", str(tmp / "pending-outbox.sqlite"), "--projects", "1",
                "--events", "3", check=True)  # fmt: skip
        for drill in ("fail", "garbage"):
            run_cli(s, "produce", "--drill", drill, check=True)
        publish(s, _overlapping_intents(s.env))
        targets = [Target("rhumbatron-operator", f"127.0.0.1:{_serve(s, processes)}")]
        # The agents' service behind an HTTP handler, refusing the worker's signature (a
        # rotation gone wrong): the auth failures.
        refusing = stack.enter_context(receiving([b"not the worker's key, 32 bytes!!"], _never))
        for role, args in (
            ("publisher", ["publish", "--outbox", str(tmp / "outbox.sqlite")]),
            ("ledger", ["consume", "--subscription", "ledger"]),
            ("causal-router", ["consume", "--subscription", "causal-router"]),
            ("worker-integration", ["worker", "--queue", "integration", "--handler", "flaky"]),
            (
                "worker-agent-wakeups",
                ["worker", "--queue", "agent-wakeups", "--http", refusing.url],
            ),
        ):
            port = free_port()
            processes.append(
                _start(
                    s,
                    args,
                    RHUMBATRON_METRICS_PORT=str(port),
                    RHUMBATRON_HTTP_HANDLER_SECRETS=WORKER_SECRET,
                )
            )
            targets.append(Target("rhumbatron-processes", f"127.0.0.1:{port}", {"role": role}))
        with running_prometheus(tmp / "prometheus", targets) as prometheus:
            wait_for("every target to be scraped", lambda: _all_up(prometheus, processes))
            # The drills dead-lettered: one poison record, one batch after its failed attempts.
            wait_for(
                "the drills' dead letters",
                lambda: (
                    (
                        _has(prometheus, 'rhumbatron_dead_letters{kind="poison"} >= 1')
                        and _has(prometheus, 'rhumbatron_dead_letters{kind="event-batch"} >= 1')
                    )
                    or None
                ),
                SERIES_TIMEOUT_S,
            )
            yield prometheus
    finally:
        for proc in processes:
            proc.terminate()
        for proc in processes:
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=30)
        stack.close()
        cleanup_environment(s)


WORKER_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def _never(body: dict[str, object], headers: dict[str, str]) -> Reply:
    raise AssertionError("the refusing receiver accepted a signature")


def _overlapping_intents(env: str) -> list[Event]:
    """Two agents of one change, the second holding a file under a directory the first declares
    twice: a prefix overlap, which the causal router asks its classifier about (the workload has
    none). With one call a day, the first question is answered and the second capped."""
    history = History(project=f"proj-overlap-{env}")
    for agent, task, paths in (
        ("agent-a", "t1", ["src/own.py"]),
        ("agent-b", "t2", ["src/api/routes.py"]),
    ):
        history.add("task.created", task=task, resources=paths)
        history.add("task.ready", task=task)
        history.add("task.started", task=task, agentId=agent)
    for resources in (["src/api"], ["src"]):
        history.add("intent.declared", task="t1", agentId="agent-a", resources=resources)
    return history.events


def _start(s: Settings, args: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "router.cli", *args],
        cwd=ROOT,
        env=subprocess_env(s, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _serve(s: Settings, processes: list[subprocess.Popen[str]]) -> int:
    """Start ``rhumbatron serve`` on a free port; its port, once it has bound it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "serve", "--port", "0"],
        cwd=ROOT,
        env=subprocess_env(s),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    processes.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once the socket is bound
    assert line.startswith("operator page at http://127.0.0.1:"), line
    return int(line.split()[3].rstrip("/").rsplit(":", 1)[1])


def _all_up(prometheus: Prometheus, processes: list[subprocess.Popen[str]]) -> bool | None:
    for proc in processes:
        assert proc.poll() is None, f"{proc.args!r} exited {proc.returncode}"
    wanted = {"rhumbatron-operator"}
    if PER_PROCESS - NOT_YET_PRODUCED:
        wanted.add("rhumbatron-processes")
    targets = [t for t in prometheus.targets() if t["labels"]["job"] in wanted]
    return True if targets and all(t["health"] == "up" for t in targets) else None


def _has(prometheus: Prometheus, expr: str) -> bool:
    return bool(prometheus.query(expr))


def _series_of(prometheus: Prometheus, query: Query) -> list[dict[str, Any]]:
    """The query's series once it has any (a rate needs two scrapes of a fresh series)."""
    return wait_for(
        f"{query.where} to return series ({query.expr})",
        lambda: prometheus.query(query.expr) or None,
        SERIES_TIMEOUT_S,
    )


@pytest.mark.slow
@pytest.mark.integration
def test_every_panel_query_and_alert_expression_returns_series_with_the_labels_it_uses(
    tmp_path: Path,
) -> None:
    with scraped_run(tmp_path) as prometheus:
        rules = prometheus.rules()
        queries = panel_queries() + [alert_query(rule) for rule in rules]
        assert len(queries) == len(panel_queries()) + ALERT_COUNT
        waiting = [q for q in queries if q.metrics & NOT_YET_PRODUCED]
        (variable,) = _dashboard(METRICS_DASHBOARD)["templating"]["list"]
        found = LABEL_VALUES.fullmatch(variable["definition"])
        assert found, variable  # Grafana's label_values(metric, label)
        metric, label = found.groups()
        wait_for(
            f"the {variable['name']} variable to list the run's subscriptions",
            lambda: (
                {"ledger", "causal-router"} <= set(prometheus.label_values(label, metric)) or None
            ),
            SERIES_TIMEOUT_S,
        )
        for query in queries:
            if query in waiting:
                continue
            series = _series_of(prometheus, query)
            for one in series:
                assert query.labels <= one["metric"].keys(), (query, one["metric"])
    if waiting:
        pytest.skip(
            f"every other query passed; not produced yet: {', '.join(sorted(NOT_YET_PRODUCED))} "
            f"(queries skipped: {'; '.join(q.where for q in waiting)})"
        )
