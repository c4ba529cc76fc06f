"""Kafka's own command-line tools (org.apache.kafka.tools, from the jars infra/local.sh keeps in
.local/kafka/jars), run as the reference a test checks our code against: SCRAM users
(ConfigCommand) and ACLs (AclCommand). They talk to the broker through its PLAINTEXT listener,
where User:ANONYMOUS is a super user."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.support.environment import ROOT, TEST_KAFKA

JARS = Path(os.environ.get("RHUMBATRON_KAFKA_JARS", ROOT / ".local" / "kafka" / "jars"))
LOG4J = ROOT / "infra" / "kafka" / "log4j2.xml"
# A JVM starting and asking the broker once: a few seconds, bounded well above.
TOOL_TIMEOUT_S = 120.0


def tools_available() -> bool:
    return any(JARS.glob("kafka-tools-*.jar"))


def kafka_tool(main_class: str, *args: str, timeout: float = TOOL_TIMEOUT_S) -> str:
    """Run one of Kafka's tools; its stdout, or an AssertionError with its output."""
    with tempfile.TemporaryDirectory(prefix="rh-kafka-tool-") as logs:
        result = subprocess.run(
            [
                "java",
                "-Xmx256m",
                f"-Dkafka.logs.dir={logs}",
                f"-Dlog4j2.configurationFile={LOG4J}",
                "-cp",
                f"{JARS}/*",
                main_class,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if result.returncode != 0:
        raise AssertionError(
            f"{main_class} {' '.join(args)} exited {result.returncode}:\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result.stdout


def add_scram_user(
    name: str, password: str, *, mechanism: str = "SCRAM-SHA-512", bootstrap: str = TEST_KAFKA
) -> None:
    kafka_tool(
        "org.apache.kafka.tools.ConfigCommand",
        "--bootstrap-server",
        bootstrap,
        "--alter",
        "--entity-type",
        "users",
        "--entity-name",
        name,
        "--add-config",
        f"{mechanism}=[password={password}]",
    )


def add_acls(command: Sequence[str], *, bootstrap: str = TEST_KAFKA) -> str:
    """``kafka-acls.sh`` arguments (``--add --allow-principal … --topic …``), run by AclCommand."""
    return kafka_tool(
        "org.apache.kafka.tools.AclCommand", "--bootstrap-server", bootstrap, *command
    )
