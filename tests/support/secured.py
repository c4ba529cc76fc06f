"""The local broker's secured listener (SASL_SSL), as infra/local.sh made it: its address, CA and
users, read from the folder it keeps them in (client.env, ca.pem, <user>.password).

That folder is RHUMBATRON_TEST_KAFKA_SECURED_DIR when set, else .local/kafka/secured of the
checkout (the shared broker `make up` starts)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.environment import ROOT

SECURED_DIR = Path(
    os.environ.get("RHUMBATRON_TEST_KAFKA_SECURED_DIR", ROOT / ".local" / "kafka" / "secured")
)
ADMIN = "rh-admin"
APP = "rh-app"


@dataclass(frozen=True)
class SecuredListener:
    folder: Path
    bootstrap: str

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    def password(self, user: str) -> str:
        return (self.folder / f"{user}.password").read_text().strip()

    def client_config(
        self, mechanism: str, user: str = ADMIN, password: str | None = None
    ) -> dict[str, Any]:
        """librdkafka settings that log in to the listener, checking the broker's name."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": self.password(user) if password is None else password,
            "ssl.ca.location": str(self.ca_file),
            "ssl.endpoint.identification.algorithm": "https",
        }


def read_client_env(folder: Path) -> dict[str, str]:
    """client.env's RHUMBATRON_KAFKA_* assignments (its export lines skipped)."""
    values: dict[str, str] = {}
    for line in (folder / "client.env").read_text().splitlines():
        if line.startswith("RHUMBATRON_") and "=" in line:
            name, _, value = line.partition("=")
            values[name] = value
    return values


def secured_listener(folder: Path = SECURED_DIR) -> SecuredListener:
    """The listener infra/local.sh describes in ``folder``; a missing folder fails with what to
    run (a broker started before the listener existed has none)."""
    if not (folder / "client.env").is_file():
        raise AssertionError(
            f"{folder}/client.env is missing: the local broker has no secured listener yet; "
            "restart it: infra/local.sh kafka-stop && infra/local.sh kafka-start"
        )
    return SecuredListener(folder, read_client_env(folder)["RHUMBATRON_KAFKA_BOOTSTRAP"])
