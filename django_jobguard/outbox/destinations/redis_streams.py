"""Redis Streams: each message ``XADD``-ed to a stream through redis-py.

Options (``JOBGUARD["OUTBOX"]["DESTINATIONS"][name]``)::

    "BACKEND": "redis",
    "URL": "redis://localhost:6379/0",   # or "URL_ENV": an environment variable holding it
    "STREAM": "orders",                  # a template: {destination} and {key} may appear
    "MAXLEN": 100_000,                   # trim the stream to about this many entries (none: keep all)
    "TIMEOUT": 5,                        # seconds, for connecting and for each command

Each entry's fields: ``id`` (the message id, the same on every redelivery: a consumer
deduplicates on it), ``payload`` (compact JSON), ``published-at`` (ISO 8601), and the headers
every backend sends (the publisher's, then ``jobguard-key``, ``jobguard-seq``,
``jobguard-attempt``, ``jobguard-destination``). Redis assigns the entry ids: a stream's order is
the order of the ``XADD`` calls, which the relay makes one at a time per key, in commit order.

A connection error or timeout is transient (Redis may take the message later); an error
Redis answers (a key of another type under the stream's name, a stream full with ``MAXLEN``
misused) is permanent: it would answer the same again, except the answers of a Redis that fails
over, is full (``maxmemory``) or is loading, which are transient. ``MAXLEN`` trims approximately
(``~``): cheaper, and never below the number given.
"""

from __future__ import annotations

import os
import threading
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
    import redis

__all__ = ["RedisStreamDestination"]

DEFAULT_TIMEOUT_SECONDS = 5.0
_OPTIONS = frozenset({"URL", "URL_ENV", "STREAM", "MAXLEN", "TIMEOUT"})
_STREAM_FIELDS = frozenset({"destination", "key"})


def _passing_errors() -> tuple[type[Exception], ...]:
    """Errors Redis answers while it fails over, fills up or is loading: it may take the message later."""
    import redis.exceptions as errors

    return (
        errors.ReadOnlyError,
        errors.OutOfMemoryError,
        errors.TryAgainError,
        errors.MasterDownError,
        errors.ClusterDownError,
        errors.BusyLoadingError,
    )


# The entry's fields written after the publisher's headers (send()): a header of one of
# these names would be lost.
_ENTRY_FIELDS = frozenset({"id", "published-at", "payload"})


class RedisStreamDestination:
    """``XADD`` to a stream; one redis-py client (a connection pool, thread-safe) per instance."""

    backend: ClassVar[str] = "redis"

    def __init__(self, name: str, *, url: str, stream: str, maxlen: int | None, timeout: float) -> None:
        self.name = name
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self.timeout = timeout
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> RedisStreamDestination:
        """Read and check the options (no connection is made: the system check calls this)."""
        read = Options(name, options, _OPTIONS)
        if read.given("URL") and read.given("URL_ENV"):
            raise read.error("URL_ENV", "cannot be given with URL: give one of them")
        if read.given("URL"):
            url = read.text("URL")
        elif read.given("URL_ENV"):
            variable = read.text("URL_ENV")
            url = os.environ.get(variable, "")
            if not url:
                raise read.error(
                    "URL_ENV", f"names the environment variable {variable!r}, which is unset or empty"
                )
        else:
            raise read.error("URL", "is required (or URL_ENV, an environment variable holding it)")
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise read.error(
                "URL" if read.given("URL") else "URL_ENV", "must be a redis://, rediss:// or unix:// URL"
            )
        maxlen: int | None = None
        if read.given("MAXLEN"):
            value = options["MAXLEN"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise read.error("MAXLEN", f"must be an integer of at least 1, not {value!r}")
            maxlen = value
        return cls(
            name,
            url=url,
            stream=read.template("STREAM", name, fields=_STREAM_FIELDS),
            maxlen=maxlen,
            timeout=read.seconds("TIMEOUT", DEFAULT_TIMEOUT_SECONDS),
        )

    def _redis(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                import redis

                self._client = redis.Redis.from_url(
                    self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
                )
            return self._client

    def message_problem(self, key: str, headers: Mapping[str, str]) -> str | None:
        """Why ``publish()`` must refuse a message: a header named as one of the entry's own fields."""
        for name in headers:
            if name in _ENTRY_FIELDS:
                fields = ", ".join(sorted(_ENTRY_FIELDS))
                return f"header {name!r} is one of the fields the stream entry carries itself ({fields})"
        return None

    def stream_for(self, envelope: Envelope) -> str:
        """The stream ``envelope`` goes to (the ``STREAM`` template filled in)."""
        return self.stream.format(destination=envelope.destination, key=envelope.key)

    def send(self, envelope: Envelope) -> None:
        import redis

        passing: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, *_passing_errors())

        fields: dict[str, str | bytes] = {
            **_message.metadata(envelope),
            "id": envelope.id,
            "published-at": envelope.published_at.isoformat(),
            "payload": _message.body(envelope),
        }
        try:
            self._redis().xadd(
                self.stream_for(envelope),
                fields,  # type: ignore[arg-type]  # redis-py's stubs want its own FieldT
                maxlen=self.maxlen,
                approximate=True,
            )
        except passing as exc:
            raise TransientDeliveryError(
                f"Redis at {self._safe_url()} did not take the message: {exc}"
            ) from exc
        except redis.ResponseError as exc:
            raise PermanentDeliveryError(
                f"Redis refused XADD to {self.stream_for(envelope)!r}: {exc}"
            ) from exc
        except redis.RedisError as exc:
            raise TransientDeliveryError(f"Redis XADD failed: {exc}") from exc

    def _safe_url(self) -> str:
        # Never a password in an error message (stored on the message, shown in the admin).
        _userinfo, sep, tail = self.url.rpartition("@")
        return f"{self.url.split('://', 1)[0]}://***@{tail}" if sep else self.url

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
