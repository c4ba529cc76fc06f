"""The shipped dashboards, alert rules and Prometheus configuration (infra/dashboards/): promtool
accepts the rules and the configuration (and refuses a broken copy); both dashboards are valid
JSON on the provisioned data sources' uids; every panel query and every alert expression parses in
a real Prometheus; and, against a real run on the real broker scraped by Debian's prometheus, each
returns series carrying the labels its panel's legend or its alert's annotations use.

Grafana and Tempo are not run here (they cannot be installed on this machine): the dashboards'
rendering and the traces dashboard's TraceQL are not executed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.prometheus import (
    ALERT_RULES,
    DASHBOARDS,
    Prometheus,
    promtool,
    running_prometheus,
)

METRICS_DASHBOARD = DASHBOARDS / "rhumbatron-metrics.json"
TRACES_DASHBOARD = DASHBOARDS / "rhumbatron-traces.json"
PROVISIONING = DASHBOARDS / "grafana" / "provisioning"
ALERT_COUNT = 8
# Grafana's variables as the live test sets them: every subscription, and a rate window of several
# scrapes at the test's 1 s interval (Grafana's $__rate_interval is at least four scrapes).
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$subscription": ".*"}
# A comparison with a number: an alert's threshold, taken out to see the series it judges.
THRESHOLD = re.compile(r"\s*(?:==|!=|>=|<=|>|<)\s*-?[0-9][0-9.e+]*\b")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
ANNOTATION_LABEL = re.compile(r"\$labels\.(\w+)")
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Query:
    """One expression a dashboard panel or an alert runs, and the labels its series must carry."""

    where: str
    expr: str
    labels: frozenset[str]

    @property
    def metrics(self) -> set[str]:
        return set(re.findall(r"\brhumbatron_[a-z_]+", self.expr)) or {"up"}


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


def alert_queries(prometheus: Prometheus) -> list[Query]:
    """Each alert's expression as Prometheus parsed it, its thresholds taken out."""
    return [
        Query(
            f"alert {rule['name']}",
            THRESHOLD.sub("", rule["query"]),
            frozenset(ANNOTATION_LABEL.findall(" ".join(rule["annotations"].values())))
            | _grouping(rule["query"]),
        )
        for rule in prometheus.rules()
    ]


# -- promtool --------------------------------------------------------------------------------------
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


def test_promtool_accepts_the_shipped_prometheus_configuration() -> None:
    checked = promtool("check", "config", DASHBOARDS / "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {ALERT_COUNT} rules found" in checked.stdout  # it loads alerts.yml


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


def test_the_traces_dashboard_searches_by_the_attributes_the_spans_carry() -> None:
    tracing = pytest.importorskip("streams.tracing")
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
def test_every_panel_query_and_alert_expression_parses_in_prometheus(tmp_path: Path) -> None:
    with running_prometheus(tmp_path / "prometheus") as prometheus:
        rules = prometheus.rules()
        assert len(rules) == ALERT_COUNT
        assert all(rule["health"] != "err" for rule in rules), rules
        for query in panel_queries() + alert_queries(prometheus):
            prometheus.query(query.expr)  # a parse error is a QueryError naming the query
