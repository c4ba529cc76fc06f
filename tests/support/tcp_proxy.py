"""A small TCP proxy for fault tests: it listens on a local port, forwards every connection to a
target (a broker's listener, Redis, PostgreSQL), and can be told to misbehave.

- :meth:`TcpProxy.cut`: the network is gone. The port refuses new connections (its listening
  socket is closed) and every open connection is closed (FIN) on both sides;
- :meth:`TcpProxy.reset`: every open connection is reset (RST) on both sides, and each new one is
  accepted and reset at once;
- :meth:`TcpProxy.delay`: every chunk of bytes, either way, is held this long before it goes on
  (latency, not a slower pipe: chunks queue and each leaves at its own due time);
- :meth:`TcpProxy.heal`: back to plain forwarding, on the same port.

One asyncio loop in a daemon thread serves every connection; the methods above may be called from
any thread and return once the proxy is in its new state. Standard library only.

A client reaches a server through the proxy only if the server tells it to: Kafka clients connect
to the addresses the broker advertises, so a broker sits behind the proxy only on a listener
whose advertised address is the proxy's (infra/local.sh's proxied listener,
tests/support/infra.py ``PrivateServices(kafka_proxy=True)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

CHUNK = 65536
CONNECT_TIMEOUT_S = 5.0  # reaching the target; past it the client's connection is reset
CONTROL_TIMEOUT_S = 10.0  # a control call waits this long for the loop to carry it out

T = TypeVar("T")


class Mode(StrEnum):
    FORWARD = "forward"
    CUT = "cut"
    RESET = "reset"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: SO_LINGER on with a zero timeout, then close at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)  # kept in a set: hashed by identity
class _Link:
    """One client connection and its connection to the target."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self, *, rst: bool) -> None:
        """At once, dropping whatever the proxy still held for either side: with RST (``rst``)
        or a plain close (FIN)."""
        for task in self.tasks:
            task.cancel()
        for writer in (self.client, self.upstream):
            if rst:
                _reset(writer)
            else:
                writer.transport.abort()


class TcpProxy:
    """``with TcpProxy(("127.0.0.1", 6379)) as proxy: ... proxy.cut(); ... proxy.heal()``"""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self.host = host
        self.port = port  # 0: the kernel picks one at start, kept for every heal after
        self.mode = Mode.FORWARD
        self.delay_s = 0.0
        self.accepted = 0  # connections accepted and forwarded, since the start
        self.dropped = 0  # open connections closed or reset by cut and reset
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tcp-proxy", daemon=True
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def open_links(self) -> int:
        return len(self._links)

    # -- control, from any thread ----------------------------------------------------------------
    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> None:
        self._call(self._cut())

    def reset(self) -> None:
        self._call(self._reset_all())

    def delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a proxy's delay is at least 0 s, not {seconds}")
        self._call(self._set_delay(seconds))

    def heal(self) -> None:
        self._call(self._heal())

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CONTROL_TIMEOUT_S)

    # -- on the loop ---------------------------------------------------------------------------
    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _cut(self) -> None:
        self.mode = Mode.CUT
        await self._stop_listening()
        self._drop(rst=False)

    async def _reset_all(self) -> None:
        self.mode = Mode.RESET
        await self._listen()
        self._drop(rst=True)

    async def _set_delay(self, seconds: float) -> None:
        self.delay_s = seconds

    async def _heal(self) -> None:
        self.mode = Mode.FORWARD
        self.delay_s = 0.0
        await self._listen()

    def _drop(self, *, rst: bool) -> None:
        for link in list(self._links):
            link.close(rst=rst)
            self.dropped += 1
        self._links.clear()

    def _forwarding(self) -> bool:
        return self.mode is Mode.FORWARD

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._forwarding():
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            # The target is down: the client sees its connection reset, as it would without us.
            _reset(writer)
            return
        if not self._forwarding():  # cut or reset while we were connecting
            _reset(up_writer)
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        self.accepted += 1
        link.tasks = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        results = await asyncio.gather(*link.tasks, return_exceptions=True)
        if link in self._links:  # not dropped by cut or reset: it ended by itself
            self._links.discard(link)
            if any(isinstance(r, BaseException) for r in results):
                # One side reset (or broke): the other is reset too, as if no proxy were there.
                link.close(rst=True)
            else:
                for w in (writer, up_writer):
                    w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one direction. Chunks are stamped when read and sent when due, so a delay adds
        latency without throttling: while one chunk waits, the next is already being read."""
        loop = asyncio.get_running_loop()
        # b"": the end of the stream (EOF); None: the side read from broke (reset, error).
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

        async def read() -> None:
            try:
                while True:
                    data = await reader.read(CHUNK)
                    queue.put_nowait((loop.time() + self.delay_s, data))
                    if not data:
                        return
            except OSError:
                queue.put_nowait((loop.time(), None))

        feeder = asyncio.create_task(read())
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    raise ConnectionResetError("the other side of the link broke")
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await feeder
