"""NATS JetStream: each message published to a subject and acknowledged by its stream, over nats-py.

Options (``JOBGUARD["OUTBOX"]["DESTINATIONS"][name]``)::

    "BACKEND": "nats",
    "SERVERS": ["nats://127.0.0.1:4222"],   # a list, or one URL; credentials in the URL
    "SUBJECT": "orders.{key}",              # a template: {key} (the message's key), {destination}
    "STREAM": "ORDERS",                     # optional: the stream that must store it
    "DECLARE": False,                       # True: create STREAM on connecting if it is missing
    "DUPLICATE_WINDOW": 120,                # with DECLARE: the new stream's duplicate window, seconds
    "TIMEOUT": 10,                          # seconds: connecting, and waiting for the stream's ack

``send()`` returns once JetStream acknowledged the message (its ``PubAck``): the stream stored
it. The message id goes in ``Nats-Msg-Id``, so a redelivery within the stream's duplicate
window is dropped by the server (the ack says ``duplicate``; it counts as delivered); past the
window, the consumer's own deduplication on ``Nats-Msg-Id`` catches it. With STREAM, the
``Nats-Expected-Stream`` header makes the server refuse a subject that another stream holds.

Classification. Transient: no connection within TIMEOUT, no ack within TIMEOUT (the server
reconnecting, a cluster without quorum), no stream listening on the subject ("no
responders"), the server's own JetStream errors (a full stream that discards new messages,
503s). Permanent: a payload over the server's ``max_payload`` or the stream's
``max_msg_size``, a key that cannot make a subject (whitespace, ``*``, ``>``, an empty token).

Threads: nats-py is asyncio. A destination runs a private event loop in a thread of its own,
started by the first ``send()``; ``send()`` (from the relay's ordinary threads, several at
once) hands its coroutine to that loop with ``asyncio.run_coroutine_threadsafe`` and waits for
the ack, so sends from many threads share one connection and are pipelined on it. nats-py
reconnects by itself after a blip; a client that gave up is replaced at the next send.
``close()`` closes the connection and stops the loop and its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import socket
import threading
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from django_jobguard.outbox.destinations import _message
from django_jobguard.outbox.destinations._options import Options
from django_jobguard.outbox.destinations.base import (
    Envelope,
    PermanentDeliveryError,
    TransientDeliveryError,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext
    from nats.js.api import PubAck

__all__ = ["NatsDestination"]

logger = logging.getLogger("django_jobguard.outbox")

DEFAULT_SERVERS = ("nats://127.0.0.1:4222",)
DEFAULT_TIMEOUT_SECONDS = 10.0
#: NATS's own default duplicate window, for a stream DECLARE creates.
DEFAULT_DUPLICATE_WINDOW_SECONDS = 120.0
#: JetStream's error codes for a message the stream refuses as such (too large).
_MESSAGE_REFUSED_CODES = frozenset({10054})
_OPTIONS = frozenset({"SERVERS", "SUBJECT", "STREAM", "DECLARE", "DUPLICATE_WINDOW", "TIMEOUT"})
_TEMPLATE_FIELDS = frozenset({"key", "destination"})
# A stream name: no whitespace, dots, wildcards or path separators (NATS's rules).
_STREAM_NAME = re.compile(r"^[^\s.*>/\\]+$")
_T = TypeVar("_T")


def subject_problem(subject: str) -> str | None:
    """Why ``subject`` cannot be published to, or None."""
    if not subject:
        return "is empty"
    if any(char.isspace() for char in subject):
        return "contains whitespace"
    for token in subject.split("."):
        if not token:
            return "has an empty token (a leading, trailing or doubled '.')"
        if "*" in token or ">" in token:
            return "contains a wildcard ('*' or '>')"
    return None


def _require_nats(opts: Options) -> None:
    try:
        import nats  # noqa: F401
    except ImportError:
        raise ValueError(
            f"{opts.key('BACKEND')} 'nats' needs nats-py: pip install 'django-jobguard[outbox]'"
        ) from None


class NatsDestination:
    """Publishes each message to JetStream and waits for the stream's ack."""

    backend: ClassVar[str] = "nats"

    def __init__(
        self,
        name: str,
        *,
        servers: tuple[str, ...] = DEFAULT_SERVERS,
        subject: str,
        stream: str | None = None,
        declare: bool = False,
        duplicate_window: float = DEFAULT_DUPLICATE_WINDOW_SECONDS,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.name = name
        self.servers = servers
        self.subject = subject
        self.stream = stream
        self.declare = declare
        self.duplicate_window = duplicate_window
        self.timeout = timeout
        self.connection_name = f"jobguard outbox {name} ({socket.gethostname()}:{os.getpid()})"
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Touched only on the loop's thread.
        self._client: Client | None = None
        self._jetstream: JetStreamContext | None = None
        self._connecting: asyncio.Lock | None = None
        self._declared = False

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> NatsDestination:
        opts = Options(name, options, _OPTIONS)
        _require_nats(opts)
        if opts.given("SERVERS") and isinstance(options["SERVERS"], str):
            servers: tuple[str, ...] = (opts.text("SERVERS"),)
        elif opts.given("SERVERS"):
            servers = opts.strings("SERVERS")
        else:
            servers = DEFAULT_SERVERS
        for server in servers:
            scheme = server.partition("://")[0] if "://" in server else ""
            if scheme not in {"nats", "tls", "ws", "wss"}:
                # The URL is not quoted: it may hold a password or a token.
                raise opts.error(
                    "SERVERS", f"must be nats://, tls://, ws:// or wss:// URLs (a {scheme!r} one given)"
                )
        subject = opts.template("SUBJECT", fields=_TEMPLATE_FIELDS)
        problem = subject_problem(subject.format(key="key", destination=name))
        if problem:
            raise opts.error("SUBJECT", f"{problem}: {subject!r}")
        stream = opts.text("STREAM") if opts.given("STREAM") else None
        if stream is not None and not _STREAM_NAME.match(stream):
            raise opts.error(
                "STREAM", f"is not a stream name (no whitespace, '.', '*', '>', '/'): {stream!r}"
            )
        declare = opts.flag("DECLARE")
        if declare and stream is None:
            raise opts.error("DECLARE", "needs a STREAM to create")
        destination = cls(
            name,
            servers=servers,
            subject=subject,
            stream=stream,
            declare=declare,
            duplicate_window=opts.seconds("DUPLICATE_WINDOW", DEFAULT_DUPLICATE_WINDOW_SECONDS),
            timeout=opts.seconds("TIMEOUT", DEFAULT_TIMEOUT_SECONDS),
        )
        if declare:
            try:
                destination.stream_subjects()
            except ValueError as exc:
                raise opts.error("SUBJECT", str(exc)) from None
        return destination

    def subject_for(self, envelope: Envelope) -> str:
        """The subject of ``envelope``; ``PermanentDeliveryError`` when its key cannot make one."""
        subject = self.subject.format(key=envelope.key, destination=envelope.destination)
        problem = subject_problem(subject)
        if problem:
            raise PermanentDeliveryError(
                f"nats {self.name!r}: message {envelope.id}'s key {envelope.key!r} makes the subject "
                f"{subject!r}, which {problem}"
            )
        return subject

    def message_problem(self, key: str, headers: Mapping[str, str]) -> str | None:
        """Why ``publish()`` must refuse a message of ``key`` and ``headers``: a subject the key
        makes invalid, or a ``Nats-*`` header (the server reads those as instructions)."""
        subject = self.subject.format(key=key, destination=self.name)
        problem = subject_problem(subject)
        if problem:
            return f"the key {key!r} makes the NATS subject {subject!r}, which {problem}"
        for name in headers:
            if name.lower().startswith("nats-"):
                return f"header {name!r}: NATS reads Nats-* headers as instructions to the server"
        return None

    def stream_subjects(self) -> list[str]:
        """The subjects of the stream DECLARE creates: SUBJECT, from its ``{key}`` token on as ``>``."""
        fixed = self.subject.replace("{destination}", self.name)
        tokens = fixed.split(".")
        for index, token in enumerate(tokens):
            if "{key}" in token:
                if index == 0:
                    raise ValueError("must start with a token without {key} for DECLARE to make a stream")
                return [".".join([*tokens[:index], ">"])]
        return [fixed.replace("{{", "{").replace("}}", "}")]

    # The loop and its thread.

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            # What the client left running (its reader, pinger, flusher) ends before the loop.
            try:
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def _submit(self, coroutine: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._run, args=(loop,), name=f"jobguard-outbox-nats-{self.name}", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # On the loop.

    async def _connect(self) -> JetStreamContext:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._client is None or self._client.is_closed:
                self._client = self._jetstream = None
                self._declared = False
                client = await self._new_client()
                self._client, self._jetstream = client, client.jetstream(timeout=self.timeout)
            jetstream = self._jetstream
            if jetstream is None:  # pragma: no cover - set above, or the connect raised
                raise RuntimeError("no JetStream context after connecting")
            if self.declare and not self._declared:
                await self._declare_stream(jetstream)
                self._declared = True
            return jetstream

    async def _new_client(self) -> Client:
        from nats.aio.client import Client

        name = self.name

        async def on_error(exc: Exception) -> None:
            # Each failed try of a reconnect lands here; the send that waits on it reports.
            logger.debug("nats_error destination=%r error=%r", name, exc)

        async def on_disconnected() -> None:
            if not client.is_closed:  # a lost connection, not close() (which calls this too)
                logger.warning("nats_disconnected destination=%r", name)

        async def on_reconnected() -> None:
            logger.info("nats_reconnected destination=%r", name)

        client = Client()
        try:
            # nats-py retries the servers on its own (every 2 s); TIMEOUT bounds this send's wait.
            await asyncio.wait_for(
                client.connect(
                    servers=list(self.servers),
                    name=self.connection_name,
                    connect_timeout=max(1, round(self.timeout)),
                    error_cb=on_error,
                    disconnected_cb=on_disconnected,
                    reconnected_cb=on_reconnected,
                ),
                timeout=self.timeout,
            )
        except BaseException:
            try:
                await asyncio.wait_for(asyncio.shield(client.close()), timeout=self.timeout)
            except Exception as exc:  # the attempt failed already; this only stops its tasks
                logger.debug("nats_close_failed destination=%r error=%r", name, exc)
            raise
        return client

    async def _declare_stream(self, jetstream: JetStreamContext) -> None:
        from nats.js.errors import NotFoundError

        stream = self.stream or ""  # from_options refuses DECLARE without a STREAM
        try:
            await jetstream.stream_info(stream)
        except NotFoundError:
            await jetstream.add_stream(
                name=stream, subjects=self.stream_subjects(), duplicate_window=self.duplicate_window
            )
            logger.info("nats_stream_created destination=%r stream=%r", self.name, self.stream)

    async def _publish(self, subject: str, body: bytes, headers: dict[str, str]) -> PubAck:
        jetstream = await self._connect()
        return await jetstream.publish(
            subject, body, timeout=self.timeout, stream=self.stream, headers=headers
        )

    async def _close(self) -> None:
        client, self._client, self._jetstream = self._client, None, None
        # The lock belongs to this loop; the next send() may start another.
        self._connecting = None
        self._declared = False
        if client is not None and not client.is_closed:
            await client.close()

    # The relay's side.

    def send(self, envelope: Envelope) -> None:
        import nats.errors
        import nats.js.errors

        subject = self.subject_for(envelope)
        body = _message.body(envelope)
        headers = {**_message.text_headers(envelope), "Nats-Msg-Id": envelope.id}
        where = f"nats {self.name!r}: subject {subject!r}"
        future = self._submit(self._publish(subject, body, headers))
        try:
            # The coroutine is bounded by TIMEOUT twice (connecting, the ack), and the stream's
            # creation; this wait is a backstop for a loop that stopped answering.
            future.result(timeout=3 * self.timeout + 5)
        except TimeoutError as exc:  # the backstop's, a connect's or an ack's (nats' own subclass it)
            future.cancel()
            raise TransientDeliveryError(
                f"{where}: no connection or no ack within {self.timeout:g} s"
            ) from exc
        except (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError) as exc:
            raise TransientDeliveryError(f"{where}: no stream listens on it (no responders)") from exc
        except nats.errors.MaxPayloadError as exc:
            raise PermanentDeliveryError(
                f"{where}: {len(body)} bytes is over the server's max_payload"
            ) from exc
        except nats.js.errors.APIError as exc:
            detail = f"{where}: JetStream answered {exc.code} ({exc.err_code}): {exc.description}"
            if exc.err_code in _MESSAGE_REFUSED_CODES:
                raise PermanentDeliveryError(detail) from exc
            raise TransientDeliveryError(detail) from exc
        except (nats.errors.Error, OSError) as exc:
            raise TransientDeliveryError(f"{where}: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Close the connection and stop the loop's thread; a later ``send()`` starts them again."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=self.timeout + 5)
        except Exception as exc:  # the connection is being given up either way
            logger.debug("nats_close_failed destination=%r error=%r", self.name, exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=self.timeout + 5)

    def __repr__(self) -> str:
        return f"<NatsDestination {self.name!r} subject={self.subject!r}>"
