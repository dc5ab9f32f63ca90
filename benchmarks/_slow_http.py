"""The slow call of ``bench_slow_calls.py``: one HTTP/1.1 GET to its local server on loopback.

Standard library only: every system's task (each in its own virtualenv) makes exactly this
exchange, from a coroutine (``get_async``) or from blocking code (``get_blocking``: a plain
socket, which Celery's gevent pool makes cooperative by monkey-patching).
"""

from __future__ import annotations

import asyncio
import socket


def _request(host: str, i: int) -> bytes:
    return f"GET /{i} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()


def _checked(body: bytes) -> int:
    if not body.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {body[:40]!r}")
    return len(body)


async def get_async(host: str, port: int, i: int) -> int:
    """The GET from a coroutine; the length of the answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(_request(host, i))
        body = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return _checked(body)


def get_blocking(host: str, port: int, i: int) -> int:
    """The same GET from blocking code; the length of the answer."""
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_request(host, i))
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return _checked(b"".join(chunks))
