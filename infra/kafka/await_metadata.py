"""Wait, bounded, until a Kafka broker answers a Metadata request.

Standard library only, so infra/local.sh can run it before any virtual environment exists.
Speaks Metadata v4 (the oldest version Kafka 4 still accepts) over the plain wire protocol and
succeeds once the broker lists itself among the live brokers.

usage: await_metadata.py HOST:PORT NODE_ID TIMEOUT_SECONDS [PID]

With PID, gives up at once when that process has exited (the broker died while starting).
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

METADATA_KEY = 3
METADATA_VERSION = 4
CLIENT_ID = b"rhumbatron-infra"


def _request(correlation_id: int) -> bytes:
    header = struct.pack(">hhih", METADATA_KEY, METADATA_VERSION, correlation_id, len(CLIENT_ID))
    # topics = null (all topics), allow_auto_topic_creation = false
    body = struct.pack(">ib", -1, 0)
    payload = header + CLIENT_ID + body
    return struct.pack(">i", len(payload)) + payload


def _read_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection mid-response")
        chunks.extend(chunk)
    return bytes(chunks)


def live_brokers(address: str, timeout: float) -> list[int]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(_request(1))
        (size,) = struct.unpack(">i", _read_exact(sock, 4))
        data = _read_exact(sock, size)
    # correlation_id, throttle_time_ms, then the brokers array
    offset = 8
    (count,) = struct.unpack_from(">i", data, offset)
    offset += 4
    nodes = []
    for _ in range(count):
        (node_id, host_len) = struct.unpack_from(">ih", data, offset)
        offset += 6 + host_len + 4  # node id, host, port
        (rack_len,) = struct.unpack_from(">h", data, offset)
        offset += 2 + max(rack_len, 0)
        nodes.append(node_id)
    return nodes


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); /proc tells it apart.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def main() -> int:
    address, node_id, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    pid = int(sys.argv[4]) if len(sys.argv) > 4 else None
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        try:
            nodes = live_brokers(address, timeout=2.0)
            if node_id in nodes:
                return 0
            last_error = f"broker answered but lists nodes {nodes}, not {node_id}"
        except (OSError, struct.error) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if pid is not None and not _running(pid):
            print(f"broker process {pid} exited before answering a metadata request on {address}")
            return 1
        time.sleep(0.25)
    print(
        f"broker {address} did not answer a metadata request within {timeout:.0f}s ({last_error})"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
