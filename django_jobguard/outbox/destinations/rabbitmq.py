"""RabbitMQ: each message published with publisher confirms, persistent, over pika.

Options (``JOBGUARD["OUTBOX"]["DESTINATIONS"][name]``)::

    "BACKEND": "rabbitmq",
    "URL": "amqp://guest:guest@127.0.0.1:5672/%2F",   # amqp:// or amqps://, pika's URL parameters
    "EXCHANGE": "orders",          # "" is the default exchange (the routing key names a queue)
    "ROUTING_KEY": "{key}",        # a template: {key} (the message's key), {destination}
    "DECLARE": False,              # True: declare EXCHANGE (durable) on connecting
    "EXCHANGE_TYPE": "topic",      # with DECLARE: direct, topic, fanout or headers
    "TIMEOUT": 10,                 # seconds: connecting, and a broker blocking publishers

``send()`` returns once the broker confirmed the message (``basic.ack``): it is then in every
queue its routing reached, persistent (``delivery_mode`` 2), so it survives a broker restart in
a durable queue. It is published ``mandatory``: a message no queue takes comes back as an
error, never dropped in silence. The message id (AMQP ``message_id``) is the envelope's id;
its key, seq and attempt are AMQP headers beside the publisher's own.

Classification. Transient: the connection lost or refused, a broker blocking publishers
(resource alarm) past TIMEOUT, a ``basic.nack`` (the broker could not take it: an internal
error, or a queue full with ``overflow=reject-publish``), an **unroutable** message (no queue
bound for its routing key: routing is the broker's topology, not the message, and a queue
declared later, when its consumer is deployed, takes it; retries give the operator that time,
then the message is dead-lettered naming the exchange and routing key), an exchange that does
not exist or is refused to the user. Permanent: a message the broker refuses as such
(``PRECONDITION_FAILED`` on publish, e.g. over ``max_message_size``), a routing key over 255
bytes.

Threads: pika's ``BlockingConnection`` is not thread-safe, so a destination keeps one
connection and channel, used under a lock: its sends go one at a time (a confirm round trip
each, well under a millisecond on a LAN); the fleet's processes each have their own. A lost
connection is dropped and the next ``send()`` connects again. A connection left idle for half
its heartbeat is replaced before use rather than trusted: the broker may have closed it for
missed heartbeats, which a connection nobody reads from cannot answer.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from django_jobguard.outbox.destinations import _message
from django_jobguard.outbox.destinations._options import Options
from django_jobguard.outbox.destinations.base import (
    Envelope,
    PermanentDeliveryError,
    TransientDeliveryError,
)

if TYPE_CHECKING:
    from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

__all__ = ["RabbitMQDestination"]

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
DEFAULT_TIMEOUT_SECONDS = 10.0
#: The AMQP heartbeat asked for, unless the URL sets ``heartbeat=``: a broker that stops
#: answering mid-publish is given up after about this long.
HEARTBEAT_SECONDS = 60
MAX_ROUTING_KEY_BYTES = 255
_EXCHANGE_TYPES = frozenset({"direct", "topic", "fanout", "headers"})
_OPTIONS = frozenset({"URL", "EXCHANGE", "ROUTING_KEY", "DECLARE", "EXCHANGE_TYPE", "TIMEOUT"})
_TEMPLATE_FIELDS = frozenset({"key", "destination"})
# AMQP reply codes a publish's channel may be closed with.
_NOT_FOUND = 404
_PRECONDITION_FAILED = 406


def _require_pika(opts: Options) -> None:
    try:
        import pika  # noqa: F401
    except ImportError:
        raise ValueError(
            f"{opts.key('BACKEND')} 'rabbitmq' needs pika: pip install 'django-jobguard[outbox]'"
        ) from None


class RabbitMQDestination:
    """Publishes each message to an exchange and waits for the broker's confirm."""

    backend: ClassVar[str] = "rabbitmq"

    def __init__(
        self,
        name: str,
        *,
        url: str = DEFAULT_URL,
        exchange: str = "",
        routing_key: str = "{key}",
        declare: bool = False,
        exchange_type: str = "topic",
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.name = name
        self.url = url
        self.exchange = exchange
        self.routing_key = routing_key
        self.declare = declare
        self.exchange_type = exchange_type
        self.timeout = timeout
        #: The name the broker lists the connection under (``rabbitmqctl list_connections
        #: client_properties``).
        self.connection_name = f"jobguard outbox {name} ({socket.gethostname()}:{os.getpid()})"
        self._lock = threading.Lock()
        self._connection: BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._idle_limit = float("inf")
        self._last_used = 0.0

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> RabbitMQDestination:
        opts = Options(name, options, _OPTIONS)
        _require_pika(opts)
        import pika

        url = opts.text("URL", DEFAULT_URL)
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in {"amqp", "amqps"}:
            # The URL is not quoted: it may hold a password.
            raise opts.error(
                "URL", f"must be an amqp:// or amqps:// URL, not a {scheme or 'schemeless'!r} one"
            )
        try:
            pika.URLParameters(url)
        except (ValueError, TypeError) as exc:
            raise opts.error("URL", f"is not a URL pika accepts: {exc}") from None
        exchange = opts.text("EXCHANGE", "", allow_empty=True)
        declare = opts.flag("DECLARE")
        exchange_type = opts.text("EXCHANGE_TYPE", "topic")
        if exchange_type not in _EXCHANGE_TYPES:
            raise opts.error(
                "EXCHANGE_TYPE", f"must be one of {sorted(_EXCHANGE_TYPES)}, not {exchange_type!r}"
            )
        if declare and not exchange:
            raise opts.error("DECLARE", "needs an EXCHANGE: the default exchange '' cannot be declared")
        return cls(
            name,
            url=url,
            exchange=exchange,
            routing_key=opts.template("ROUTING_KEY", "{key}", fields=_TEMPLATE_FIELDS),
            declare=declare,
            exchange_type=exchange_type,
            timeout=opts.seconds("TIMEOUT", DEFAULT_TIMEOUT_SECONDS),
        )

    def _parameters(self) -> Any:
        import pika

        params = pika.URLParameters(self.url)
        given = urllib.parse.parse_qs(urllib.parse.urlsplit(self.url).query)
        if "heartbeat" not in given:
            params.heartbeat = HEARTBEAT_SECONDS
        if "blocked_connection_timeout" not in given:
            params.blocked_connection_timeout = self.timeout
        if "socket_timeout" not in given:
            params.socket_timeout = self.timeout
        if "stack_timeout" not in given:
            params.stack_timeout = self.timeout
        if "connection_attempts" not in given:
            # One try per send: the relay's backoff spaces the tries, not a loop in here.
            params.connection_attempts = 1
        params.client_properties = {"connection_name": self.connection_name, "product": "django-jobguard"}
        heartbeat = params.heartbeat
        self._idle_limit = heartbeat / 2 if isinstance(heartbeat, int) and heartbeat > 0 else float("inf")
        return params

    def _open(self) -> BlockingChannel:
        """The channel to publish on, connecting (and declaring) first when needed. Lock held."""
        import pika

        if self._channel is not None and self._connection is not None:
            fresh = time.monotonic() - self._last_used < self._idle_limit
            if fresh and self._channel.is_open and self._connection.is_open:
                return self._channel
            self._drop()
        connection = pika.BlockingConnection(self._parameters())
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            if self.declare:
                channel.exchange_declare(
                    exchange=self.exchange, exchange_type=self.exchange_type, durable=True
                )
        except BaseException:
            self._connection = connection
            self._drop()
            raise
        self._connection, self._channel = connection, channel
        return channel

    def _drop(self) -> None:
        """Forget the connection, closing it if it can still be closed. Lock held."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception:  # noqa: S110 - it is being thrown away; a dead one cannot close cleanly
                pass

    def message_problem(self, key: str, headers: Mapping[str, str]) -> str | None:
        """Why ``publish()`` must refuse a message of ``key``: a routing key over 255 bytes."""
        routing_key = self.routing_key.format(key=key, destination=self.name)
        size = len(routing_key.encode())
        if size > MAX_ROUTING_KEY_BYTES:
            return (
                f"the key makes a routing key of {size} bytes as UTF-8, over AMQP's "
                f"{MAX_ROUTING_KEY_BYTES}: {routing_key[:80]!r}..."
            )
        return None

    def routing_key_for(self, envelope: Envelope) -> str:
        """The routing key ``envelope`` is published with."""
        return self.routing_key.format(key=envelope.key, destination=envelope.destination)

    def send(self, envelope: Envelope) -> None:
        import pika
        import pika.exceptions as amqp

        body = _message.body(envelope)
        routing_key = self.routing_key_for(envelope)
        if len(routing_key.encode()) > MAX_ROUTING_KEY_BYTES:
            raise PermanentDeliveryError(
                f"rabbitmq {self.name!r}: the routing key of message {envelope.id} is over "
                f"{MAX_ROUTING_KEY_BYTES} bytes: {routing_key[:80]!r}..."
            )
        properties = pika.BasicProperties(
            message_id=envelope.id,
            delivery_mode=pika.DeliveryMode.Persistent,
            content_type="application/json",
            timestamp=int(envelope.published_at.timestamp()),
            app_id="django-jobguard",
            headers=_message.metadata(envelope),
        )
        where = f"rabbitmq {self.name!r}: exchange {self.exchange!r}, routing key {routing_key!r}"
        with self._lock:
            try:
                channel = self._open()
            except (amqp.AMQPError, OSError) as exc:
                raise TransientDeliveryError(
                    f"rabbitmq {self.name!r}: cannot connect or declare: {type(exc).__name__}: {exc}"
                ) from exc
            try:
                channel.basic_publish(self.exchange, routing_key, body, properties, mandatory=True)
            except amqp.UnroutableError as exc:
                self._last_used = time.monotonic()
                raise TransientDeliveryError(
                    f"{where}: unroutable, no queue is bound for it (message returned by the broker)"
                ) from exc
            except amqp.NackError as exc:
                self._last_used = time.monotonic()
                raise TransientDeliveryError(f"{where}: the broker refused it (basic.nack)") from exc
            except amqp.ChannelClosedByBroker as exc:
                self._drop()
                detail = f"{where}: the broker closed the channel: {exc.reply_code} {exc.reply_text}"
                if exc.reply_code == _PRECONDITION_FAILED:
                    raise PermanentDeliveryError(detail) from exc
                if exc.reply_code == _NOT_FOUND:
                    detail += " (declare the exchange, or set DECLARE)"
                raise TransientDeliveryError(detail) from exc
            except (amqp.AMQPError, OSError) as exc:
                self._drop()
                raise TransientDeliveryError(
                    f"{where}: connection lost: {type(exc).__name__}: {exc}"
                ) from exc
            except BaseException:
                # Anything else leaves the connection in an unknown state: start afresh.
                self._drop()
                raise
            self._last_used = time.monotonic()

    def close(self) -> None:
        """Close the connection; a later ``send()`` connects again."""
        with self._lock:
            self._drop()

    def __repr__(self) -> str:
        return f"<RabbitMQDestination {self.name!r} exchange={self.exchange!r}>"
