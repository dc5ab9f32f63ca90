"""Counts what clients send PostgreSQL, on the wire: round trips and statements.

A loopback proxy in front of the server. Each simple query message is one round trip and
holds as many statements as its string does (a limited claim's strings carry several);
the BEGIN and COMMIT a driver sends on its own are messages like any other, so they count.
An extended-protocol exchange counts one round trip per Sync and one statement per Execute.
Clients are told the proxy speaks no TLS, so everything it forwards can be read.
"""

from __future__ import annotations

import asyncio
import collections
import re
import struct
import threading

_QUOTED = re.compile(r"'(?:[^']|'')*'")
_NEGOTIATIONS = {80877103, 80877104}  # SSLRequest, GSSENCRequest


def kind_of(sql: str) -> str:
    """A statement's kind for the breakdown: its first words, values and names left out."""
    words = re.sub(r"\s+", " ", _QUOTED.sub("''", sql)).strip().split(" ")
    return " ".join(words[:6])[:60]


def statements_in(sql: str) -> int:
    """How many statements ``sql`` holds: its semicolons outside literals, plus a last one."""
    parts = [part for part in _QUOTED.sub("''", sql).split(";") if part.strip()]
    return max(1, len(parts))


class WireCounter:
    """Listens on 127.0.0.1 (``port`` once started) and forwards to ``upstream``."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.round_trips = 0
        self.statements = 0
        #: Statements per kind (:func:`kind_of`), for a breakdown of what a job costs.
        self.kinds: collections.Counter[str] = collections.Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wire-counter", daemon=True)

    def start(self) -> WireCounter:
        """Listen (in a daemon thread, which ends with the process)."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the counting proxy did not start")
        return self

    def reset(self) -> None:
        self.round_trips = self.statements = 0
        self.kinds.clear()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            while True:  # the startup packet, after any TLS or GSS request (declined)
                size = struct.unpack("!I", await client_in.readexactly(4))[0]
                startup = await client_in.readexactly(size - 4)
                if struct.unpack("!I", startup[:4])[0] not in _NEGOTIATIONS:
                    break
                client_out.write(b"N")
                await client_out.drain()
            server_in, server_out = await asyncio.open_connection(*self.upstream)
            server_out.write(struct.pack("!I", size) + startup)
            await asyncio.gather(self._to_server(client_in, server_out), self._pipe(server_in, client_out))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            client_out.close()

    async def _to_server(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        prepared: dict[bytes, str] = {}  # this connection's statement names -> their kind
        bound = ""
        try:
            while True:
                head = await source.readexactly(5)
                body = await source.readexactly(struct.unpack("!I", head[1:])[0] - 4)
                kind = head[:1]
                if kind == b"Q":
                    self.round_trips += 1
                    sql = body[:-1].decode("utf-8", "replace")
                    self.statements += statements_in(sql)
                    for part in _QUOTED.sub("''", sql).split(";"):
                        if part.strip():
                            self.kinds[kind_of(part)] += 1
                elif kind == b"P":
                    name, _, rest = body.partition(b"\0")
                    prepared[name] = bound = kind_of(rest.partition(b"\0")[0].decode("utf-8", "replace"))
                elif kind == b"B":
                    statement = body.partition(b"\0")[2].partition(b"\0")[0]
                    bound = prepared.get(statement, "(unknown prepared statement)")
                elif kind == b"E":
                    self.statements += 1
                    self.kinds[bound] += 1
                elif kind == b"S":
                    self.round_trips += 1
                sink.write(head + body)
                await sink.drain()
        finally:
            sink.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while chunk := await source.read(65536):
                sink.write(chunk)
                await sink.drain()
        finally:
            sink.close()
