"""Webhooks: an HTTP POST of the JSON payload, signed as Standard Webhooks specifies, over httpx.

Options (``JOBGUARD["OUTBOX"]["DESTINATIONS"][name]``)::

    "BACKEND": "webhook",
    "URL": "https://hooks.example.com/orders",    # http or https
    "SECRETS": ["whsec_..."],   # or "SECRETS_ENV": "ORDERS_WEBHOOK_SECRETS"; several = rotation
    "TIMEOUT": 10,              # seconds, for each of connect, write, read and the pool wait
    "HEADERS": {"Authorization": "Bearer ..."},  # static extra headers

The answer decides: 2xx delivered; 408, 429, 5xx, timeouts and connection errors transient
(the endpoint may take it later); any other status, 410 Gone and redirects included,
permanent (the endpoint will answer the same again).
"""

from __future__ import annotations

import datetime
import email.utils
import threading
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from django_jobguard.outbox import signing
from django_jobguard.outbox.destinations import _message
from django_jobguard.outbox.destinations._options import Options
from django_jobguard.outbox.destinations.base import (
    Envelope,
    PermanentDeliveryError,
    TransientDeliveryError,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["WebhookDestination"]

DEFAULT_TIMEOUT_SECONDS = 10.0
#: How much of a refusing answer's body is read, and how much of it an error message quotes.
ERROR_BODY_READ_BYTES = 4096
ERROR_BODY_QUOTED_CHARS = 200
#: The longest ``Retry-After`` honoured, in seconds: an endpoint asking for more (a typo, a
#: date years ahead) gets its key retried after an hour rather than stalled for good.
MAX_RETRY_AFTER_SECONDS = 3600.0
#: Answers the endpoint may change its mind about: a timeout, a rate limit, its own failures.
_TRANSIENT_STATUSES = frozenset({408, 425, 429})
_OPTIONS = frozenset({"URL", "SECRETS", "SECRETS_ENV", "TIMEOUT", "HEADERS"})
# The headers this backend writes itself: a static or publisher's header of the same name loses.
_RESERVED = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature", "content-type"})


def _retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds from now (delay-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_SECONDS)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT; a zoneless one is read as such
        when = when.replace(tzinfo=datetime.UTC)
    seconds = (when - datetime.datetime.now(tz=datetime.UTC)).total_seconds()
    return min(max(0.0, seconds), MAX_RETRY_AFTER_SECONDS)


class WebhookDestination:
    """Delivers each message as a signed HTTP POST, on one ``httpx.Client`` per destination.

    ``send()`` may be called from several threads at once: ``httpx.Client`` is thread-safe and
    pools connections, so each thread's request reuses an idle connection or opens one.
    """

    backend: ClassVar[str] = "webhook"

    def __init__(
        self,
        name: str,
        *,
        url: str,
        secrets: tuple[str, ...],
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.url = url
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        #: The URL as errors and logs show it: no user, password or query (they may hold a token).
        self.shown_url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        self.secrets = secrets
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> WebhookDestination:
        opts = Options(name, options, _OPTIONS)
        url = opts.text("URL")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            # Only the scheme is quoted: a URL may carry a token or a password.
            raise opts.error(
                "URL", f"must be an http:// or https:// URL with a host (scheme given: {parts.scheme!r})"
            )
        try:
            parts.port  # noqa: B018 - urlsplit checks the port only when asked
        except ValueError as exc:
            raise opts.error("URL", f"has an invalid port: {exc}") from None
        secrets = opts.strings("SECRETS", env_option="SECRETS_ENV")
        source = opts.key("SECRETS") if opts.given("SECRETS") else opts.key("SECRETS_ENV")
        for index, secret in enumerate(secrets):
            try:
                signing.decode_secret(secret)
            except ValueError as exc:
                # The secret itself is never quoted: it may sit in a log.
                raise ValueError(f"{source}: secret {index}: {exc}") from None
        headers = opts.str_mapping("HEADERS")
        for header, value in headers.items():
            problem = _message.header_problem(header, value)
            if problem:
                raise opts.error("HEADERS", problem)
            if header.lower() in _RESERVED:
                raise opts.error("HEADERS", f"may not set {header!r}: the destination writes it")
        return cls(
            name,
            url=url,
            secrets=secrets,
            timeout=opts.seconds("TIMEOUT", DEFAULT_TIMEOUT_SECONDS),
            headers=headers,
        )

    def message_problem(self, key: str, headers: Mapping[str, str]) -> str | None:
        """Why ``publish()`` must refuse a message: a header the destination writes itself."""
        for name in headers:
            if name.lower() in _RESERVED:
                return f"header {name!r} is written by the webhook destination itself"
        return None

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                import httpx

                # No redirects: a signed POST is not re-sent elsewhere; a 3xx is reported.
                self._client = httpx.Client(timeout=httpx.Timeout(self.timeout), follow_redirects=False)
            return self._client

    def request_headers(self, envelope: Envelope, body: bytes) -> dict[str, str]:
        """A request's headers: the static ones, the publisher's, jobguard's, then the signature's.

        A later one replaces an earlier one of the same name, whatever the case of its letters.
        """
        headers: dict[str, str] = {}
        for header, value in self.headers.items():
            headers[header.lower()] = value
        for header, value in _message.text_headers(envelope).items():
            if header.lower() not in _RESERVED:
                headers[header.lower()] = value
        headers["content-type"] = "application/json"
        headers.update(signing.signature_headers(self.secrets, envelope.id, body))
        return headers

    def send(self, envelope: Envelope) -> None:
        import httpx

        body = _message.body(envelope)
        headers = self.request_headers(envelope, body)
        client = self._http()
        try:
            with client.stream("POST", self.url, content=body, headers=headers) as response:
                status = response.status_code
                # The body is read (up to a bound) even when only the status counts: a
                # connection goes back to the pool only once its answer was read to the end.
                head = self._read_some(response)
                if 200 <= status < 300:
                    return
                excerpt = self._excerpt(response, head)
        except httpx.TimeoutException as exc:
            raise TransientDeliveryError(
                f"webhook {self.name!r}: no answer from {self.shown_url} within {self.timeout:g} s "
                f"({type(exc).__name__})"
            ) from exc
        except httpx.TransportError as exc:
            raise TransientDeliveryError(
                f"webhook {self.name!r}: cannot reach {self.shown_url}: {type(exc).__name__}: {exc}"
            ) from exc
        reason = f"webhook {self.name!r}: {self.shown_url} answered {status}"
        if excerpt:
            reason += f": {excerpt}"
        if status in _TRANSIENT_STATUSES or status >= 500:
            retry_after = response.headers.get("retry-after")
            if retry_after:
                reason += f" (Retry-After: {retry_after[:40]})"
            error = TransientDeliveryError(reason)
            # The relay waits this long, rather than its own backoff, when the endpoint said.
            error.retry_after = _retry_after_seconds(retry_after)  # type: ignore[attr-defined]
            raise error
        if 300 <= status < 400:
            location = response.headers.get("location", "")
            reason += f" (a redirect to {location[:200]!r}: set URL to the address that answers 2xx)"
        raise PermanentDeliveryError(reason)

    @staticmethod
    def _read_some(response: httpx.Response) -> bytes:
        """The answer's first ``ERROR_BODY_READ_BYTES`` or so, read no further."""
        import httpx

        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= ERROR_BODY_READ_BYTES:
                    break
        except httpx.HTTPError:
            pass  # the status decides; a body cut short only shortens an error's message
        return b"".join(chunks)[:ERROR_BODY_READ_BYTES]

    @staticmethod
    def _excerpt(response: httpx.Response, head: bytes) -> str:
        """The first characters of a refusing answer's body, on one line."""
        text = head.decode(response.encoding or "utf-8", "replace")
        return " ".join(text.split())[:ERROR_BODY_QUOTED_CHARS]

    def close(self) -> None:
        """Close the client's connections; a later ``send()`` opens new ones."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __repr__(self) -> str:
        return f"<WebhookDestination {self.name!r} {self.shown_url}>"
