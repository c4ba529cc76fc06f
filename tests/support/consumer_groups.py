"""Kafka's own ``kafka-consumer-groups --describe`` (``ConsumerGroupCommand`` of
``org.apache.kafka:kafka-tools``, the broker's release, from the jars ``infra/local.sh jars``
keeps in .local/kafka/jars), run as the reference our lag figures are checked against, and its
table parsed."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.support.environment import ROOT, TEST_KAFKA

JARS = Path(os.environ.get("RHUMBATRON_KAFKA_JARS", ROOT / ".local" / "kafka" / "jars"))
LOG4J = ROOT / "infra" / "kafka" / "log4j2.xml"
MAIN = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
# A JVM starting and asking the broker a few things: seconds; bounded well above that.
TOOL_TIMEOUT_S = 120.0
COLUMNS = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG")


@dataclass(frozen=True)
class DescribedPartition:
    """One row of the tool's table (None where it prints ``-``)."""

    group: str
    topic: str
    partition: int
    current: int | None
    end: int | None
    lag: int | None


def tool_available() -> bool:
    return any(JARS.glob("kafka-tools-*.jar"))


def _number(cell: str) -> int | None:
    return None if cell == "-" else int(cell)


def parse_describe(output: str) -> list[DescribedPartition]:
    """The rows of every table in the output (one per group: a header line naming the columns,
    then a line per partition); other lines (``Consumer group 'g' has no active members.``) are
    not rows."""
    rows: list[DescribedPartition] = []
    index: dict[str, int] | None = None
    for line in output.splitlines():
        cells = line.split()
        if not cells:
            index = None
            continue
        if cells[: len(COLUMNS)] == list(COLUMNS):
            index = {name: cells.index(name) for name in COLUMNS}
            continue
        if index is None or len(cells) < len(COLUMNS):
            continue
        rows.append(
            DescribedPartition(
                group=cells[index["GROUP"]],
                topic=cells[index["TOPIC"]],
                partition=int(cells[index["PARTITION"]]),
                current=_number(cells[index["CURRENT-OFFSET"]]),
                end=_number(cells[index["LOG-END-OFFSET"]]),
                lag=_number(cells[index["LAG"]]),
            )
        )
    return rows


def describe_groups(
    groups: Iterable[str], *, bootstrap: str = TEST_KAFKA
) -> list[DescribedPartition]:
    """``kafka-consumer-groups --describe --group G ...`` in one run of the tool."""
    args = [arg for group in groups for arg in ("--group", group)]
    with tempfile.TemporaryDirectory(prefix="rh-consumer-groups-") as logs:
        result = subprocess.run(
            [
                "java",
                "-Xmx256m",
                f"-Dkafka.logs.dir={logs}",
                f"-Dlog4j2.configurationFile={LOG4J}",
                "-cp",
                f"{JARS}/*",
                MAIN,
                "--describe",
                *args,
                "--bootstrap-server",
                bootstrap,
            ],
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_S,
            check=False,
        )
    if result.returncode != 0:
        raise AssertionError(
            f"{MAIN} --describe {' '.join(args)} exited {result.returncode}:\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return parse_describe(result.stdout)
