"""The operator server run for real in a thread (uvicorn on a socket bound to 127.0.0.1, any free
port), and a command dead letter written through the real dead-letter store."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from consumers.runtime.dead_letters import DeadLetter, Entry, LetterKind, command_letter_id
from router.operator.server import address_of, bind, server
from router.operator.service import OperatorService
from router.settings import Settings
from router.wiring.subscription import dead_letters
from streams.envelopes import Command, build, encode, format_time
from streams.headers import ERROR, ORIGIN_QUEUE
from streams.topology import queue_name

START_TIMEOUT_S = 30.0


@contextmanager
def running_server(service: OperatorService) -> Iterator[str]:
    """Yields the server's base URL (``http://127.0.0.1:PORT/``) once it accepts requests."""
    sock = bind("127.0.0.1", 0)
    running = server(service)
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not running.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise AssertionError("the operator server did not start")
        time.sleep(0.02)
    try:
        yield address_of(sock)
    finally:
        running.should_exit = True
        thread.join(timeout=START_TIMEOUT_S)
        sock.close()


def write_command_letter(
    s: Settings, client: redis.Redis[bytes], *, task: str, queue: str = "integration"
) -> tuple[DeadLetter, bytes]:
    """A command the workers gave up on, as the dead-letter consumer records it."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    command = build(
        Command,
        command_id=f"cmd_{task}_ready",
        command_type="agent.wake",
        project_id=f"proj-{task}",
        task_id=task,
        created_at=now,
        payload={"agent": "agent-1"},
    )
    raw = encode(command, max_bytes=s.max_envelope_bytes)
    letter = DeadLetter(
        id=command_letter_id(command.command_id),
        kind=LetterKind.COMMAND,
        source_topic=queue_name("dead-letter", s.env),
        source_partition=0,
        error="RuntimeError: the agent host refused the wake",
        error_type="RuntimeError",
        attempts=4,
        created_at=format_time(now),
        entries=[
            Entry(
                offset=0,
                value=raw,
                key=command.project_id.encode(),
                headers=[(ERROR, b"refused"), (ORIGIN_QUEUE, queue.encode())],
            )
        ],
        origin_queue=queue,
        command_id=command.command_id,
    )
    dead_letters(s, client).write([letter])
    return letter, raw
