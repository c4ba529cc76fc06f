"""The Prometheus scrape of the operator server (``GET /metrics``), in the text exposition format,
computed on each scrape from the same service code as the API: consumer lag per partition (from
the one place lag is computed), outbox depth by state and held projects, dead letters by kind and
status, and the command workers' counters (false wakeups among them).

A source that cannot be read right now (Kafka or Redis down, an outbox file missing) is left out
of the scrape and ``rhumbatron_scrape_error{source=...}`` says so, rather than failing the scrape.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from router.operator.service import OperatorService

Sample = tuple[dict[str, str], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        lines.append(f"{name}{{{label_text}}} {value:g}" if label_text else f"{name} {value:g}")
    return lines


def render(service: OperatorService) -> str:
    lines: list[str] = []
    errors: list[Sample] = []

    def section(source: str, build: Callable[[], list[str]]) -> None:
        try:
            lines.extend(build())
            errors.append(({"source": source}, 0))
        except Exception:  # a down dependency must not fail the whole scrape
            errors.append(({"source": source}, 1))

    def lag() -> list[str]:
        report = service.lag()
        samples = [
            (
                {
                    "subscription": s.subscription,
                    "group": s.group,
                    "topic": p.topic,
                    "partition": str(p.partition),
                },
                float(p.lag),
            )
            for s in report.subscriptions
            for p in s.partitions
        ]
        return _family(
            "rhumbatron_consumer_lag",
            "gauge",
            "records behind the log end, per group and partition",
            samples,
        )

    def outboxes() -> list[str]:
        depth: list[Sample] = []
        held: list[Sample] = []
        oldest: list[Sample] = []
        for report in service.outboxes():
            if not report.present or report.error:
                continue
            for state, n in report.counts.items():
                depth.append(({"outbox": report.outbox, "state": state}, float(n)))
            held.append(({"outbox": report.outbox}, float(len(report.held_projects))))
            if report.oldest_pending_age_s is not None:
                oldest.append(({"outbox": report.outbox}, report.oldest_pending_age_s))
        return (
            _family("rhumbatron_outbox_rows", "gauge", "outbox rows by state", depth)
            + _family(
                "rhumbatron_outbox_held_projects",
                "gauge",
                "projects held back by a failed row",
                held,
            )
            + _family(
                "rhumbatron_outbox_oldest_pending_seconds",
                "gauge",
                "age of the oldest pending row",
                oldest,
            )
        )

    def dead_letters() -> list[str]:
        letters = service.letters().list(limit=service.settings.operator_dead_letter_scan_limit)
        counts = Counter((d.kind, d.status) for d in letters)
        samples = [
            ({"kind": kind.value, "status": status.value}, float(n))
            for (kind, status), n in sorted(counts.items())
        ]
        return _family(
            "rhumbatron_dead_letters", "gauge", "dead letters by kind and status", samples
        )

    def workers() -> list[str]:
        from router.wiring.workers import worker_figures

        queues = worker_figures(service.settings, service.redis())["queues"]
        samples = [
            ({"queue": queue, "counter": counter}, float(value))
            for queue, counters in sorted(queues.items())
            for counter, value in sorted(counters.items())
        ]
        return _family(
            "rhumbatron_worker_total",
            "counter",
            "command worker counters (ok, retried, dead_lettered, false_wakeup, ...)",
            samples,
        )

    section("kafka-lag", lag)
    section("outboxes", outboxes)
    section("dead-letters", dead_letters)
    section("workers", workers)
    lines.extend(
        _family(
            "rhumbatron_scrape_error",
            "gauge",
            "1 when a source could not be read for this scrape",
            errors,
        )
    )
    return "\n".join(lines) + "\n"
