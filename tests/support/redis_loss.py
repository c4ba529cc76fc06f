"""Redis losing its data, for one test environment: every key of the environment deleted (the
keys of ``rh:<env>:…``), never FLUSHDB or FLUSHALL, since other tests share the server."""

from __future__ import annotations

from typing import Any


def delete_environment_keys(client: Any, env: str) -> int:
    """Delete the environment's keys; returns how many there were."""
    keys = list(client.scan_iter(match=f"rh:{env}:*", count=1000))
    for key in keys:
        client.delete(key)
    left = list(client.scan_iter(match=f"rh:{env}:*", count=1000))
    assert left == [], f"keys of {env} came back while deleting: {left[:5]}"
    return len(keys)
