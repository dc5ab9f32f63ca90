"""The relay: delivers published messages, one at a time per key, in commit order, keys in parallel.

It runs inside ``jobguard_worker`` (not ``--burst``) as one thread that claims keys and
``OUTBOX["RELAY_CONCURRENCY"]`` delivery threads, each with its own database connection and
its own instance of each destination (so a backend's client need not be thread-safe).

A claim leases a key (owner token, expiry on the database clock, see
:mod:`django_jobguard.store.outbox`). The thread holding it then, for each message after the
key's ``delivered_seq``:

1. makes sure of its lease: renewed before the key's first send, then by each delivery's
   record, and again before a send whenever a third of it has passed since (a key whose lease
   another relay took is dropped at once);
2. sends the message (:class:`~.destinations.base.Envelope`, its ``id`` stable across attempts);
3. records the outcome in one transaction that matches the lease token and the key's
   ``delivered_seq``, so a relay that lost its key can record nothing:

   - delivered: ``delivered_seq`` moves to the message, which is marked delivered;
   - a transient error (``TransientDeliveryError``, or an error nobody classified when
     ``UNCLASSIFIED_ERRORS`` is "transient") with attempts left: the message waits out the
     destination's ``RETRY`` backoff (or the ``retry_after`` the error carries), and so does
     its key: the lease is given back with ``retry_at`` set;
   - a permanent error, or the last attempt failed: the message is dead. ``ON_FAILURE``
     "hold" holds the key (nothing behind it is sent) until an operator replays or skips it
     (:mod:`.operations`); "skip" passes over it.

A crash between a send and its record sends the message again once the lease expires, with
the same id: at least once, never lost, and a duplicate carries the first one's id. A key is
given back after ``RELAY_BATCH_SIZE`` messages, so one busy key cannot keep a thread from the others.
"""

from __future__ import annotations

import datetime
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, InterfaceError, connections, transaction
from django.db.models import F
from django.utils import timezone

from .. import events
from ..conf import DestinationConfig, get_settings
from ..retry import PERMANENT, TRANSIENT, backoff, requested_delay
from ..store import outbox as outbox_rows
from ..store.outbox import ClaimedKey
from .destinations.base import Destination, Envelope, PermanentDeliveryError, TransientDeliveryError
from .events import OutboxDead, OutboxDelivered, OutboxFailed
from .loading import build

if TYPE_CHECKING:
    from ..models import OutboxMessage

logger = logging.getLogger("django_jobguard.outbox")

__all__ = ["ERROR_BACKOFF_SECONDS", "Relay", "start"]

#: Seconds the relay waits after a database error before it claims again.
ERROR_BACKOFF_SECONDS = 5.0
#: Seconds a key whose destination cannot be built waits before it is tried again.
BROKEN_DESTINATION_RETRY_SECONDS = 60.0
#: Seconds the relay waits for its delivery threads at shutdown (each finishes its current send).
JOIN_SECONDS = 15.0
#: Characters of a delivery error stored on the message.
MAX_ERROR_CHARS = 2000


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


class Relay:
    """Delivers the messages of every declared destination until :meth:`stop`."""

    def __init__(self, alias: str, worker_id: str = "") -> None:
        conf = get_settings().outbox
        self.alias = alias
        self.worker_id = worker_id
        self.concurrency = conf.relay_concurrency
        self.destinations = sorted(conf.destinations)
        self._stop = threading.Event()
        self._freed = threading.Event()
        self._keys: queue.Queue[tuple[ClaimedKey, str] | None] = queue.Queue()
        self._busy = 0
        self._lock = threading.Lock()
        #: Messages delivered by this relay (for tests and the worker's summary).
        self.delivered = 0
        self.thread: threading.Thread | None = None

    # -- the claiming thread -----------------------------------------------------------------

    def run(self) -> None:
        """The relay's thread: claim keys while delivery threads are free; ends after :meth:`stop`."""
        threads = [
            threading.Thread(target=self._deliver_loop, name=f"jobguard-outbox-{index}", daemon=True)
            for index in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        try:
            while not self._stop.is_set():
                self._freed.clear()
                with self._lock:
                    idle = self.concurrency - self._busy
                claimed: list[ClaimedKey] = []
                token = uuid.uuid4().hex
                if idle > 0:
                    try:
                        claimed = self.claim(token, idle)
                    except (DatabaseError, InterfaceError):
                        logger.warning("outbox_claim_failed worker_id=%s", self.worker_id, exc_info=True)
                        connections[self.alias].close()
                        self._stop.wait(ERROR_BACKOFF_SECONDS)
                        continue
                for key in claimed:
                    with self._lock:
                        self._busy += 1
                    self._keys.put((key, token))
                if idle and len(claimed) < idle:
                    # Nothing more to claim now: look again after the poll interval.
                    self._stop.wait(get_settings().outbox.relay_poll_interval)
                else:
                    # Every thread busy (or maybe more work): claim again when one is free.
                    self._freed.wait(get_settings().outbox.relay_poll_interval)
        finally:
            for _ in threads:
                self._keys.put(None)
            deadline = time.monotonic() + JOIN_SECONDS  # one wait for all: shutdown stays bounded
            for thread in threads:
                thread.join(timeout=max(deadline - time.monotonic(), 0.0))
            connections[self.alias].close()

    def claim(self, token: str, limit: int) -> list[ClaimedKey]:
        """Lease up to ``limit`` keys that have messages to deliver (under ``token``)."""
        lease = get_settings().outbox.relay_lease
        return outbox_rows.claim_keys(self.alias, self.destinations, token, lease, limit)

    def stop(self) -> None:
        """Stop claiming; delivery threads give their keys back after their current send."""
        self._stop.set()
        self._freed.set()

    def join(self, timeout: float = JOIN_SECONDS + 5) -> None:
        if self.thread is not None:
            self.thread.join(timeout=timeout)

    def drain(self) -> int:
        """Deliver what is due now in the calling thread, key after key; the messages delivered.

        For tests and scripts: the worker's relay runs :meth:`run` instead.
        """
        own: dict[str, Destination] = {}
        before = self.delivered
        try:
            while True:
                token = uuid.uuid4().hex
                claimed = self.claim(token, 1)
                if not claimed:
                    return self.delivered - before
                self.deliver_key(claimed[0], token, own)
        finally:
            _close_all(own)

    # -- the delivery threads ----------------------------------------------------------------

    def _deliver_loop(self) -> None:
        own: dict[str, Destination] = {}
        try:
            while True:
                item = self._keys.get()
                if item is None:
                    return
                claimed, token = item
                try:
                    self.deliver_key(claimed, token, own)
                except Exception:
                    # The key's lease expires and another pass takes it again: nothing is lost.
                    logger.exception(
                        "outbox_delivery_failed worker_id=%s destination=%s key=%r",
                        self.worker_id,
                        claimed.destination,
                        claimed.key,
                    )
                    connections[self.alias].close()
                    self._stop.wait(ERROR_BACKOFF_SECONDS)
                finally:
                    with self._lock:
                        self._busy -= 1
                    self._freed.set()
        finally:
            _close_all(own)
            connections[self.alias].close()

    def deliver_key(self, claimed: ClaimedKey, token: str, own: dict[str, Destination]) -> None:
        """Deliver ``claimed``'s messages in order until it has none, must wait, is held, or is lost."""
        config = get_settings().outbox.destination(claimed.destination)
        if config is None:  # undeclared since the claim (settings changed in a test): leave it
            outbox_rows.release_lease(self.alias, claimed.cursor_id, token, BROKEN_DESTINATION_RETRY_SECONDS)
            return
        destination = own.get(config.name)
        if destination is None:
            try:
                destination = own[config.name] = build(config)
            except ValueError:
                logger.exception("outbox_destination_broken destination=%s", config.name)
                outbox_rows.release_lease(
                    self.alias, claimed.cursor_id, token, BROKEN_DESTINATION_RETRY_SECONDS
                )
                return
        seq = claimed.delivered_seq
        lease = get_settings().outbox.relay_lease
        renewed = -math.inf  # the first send renews the lease: the claim may have waited
        for _ in range(get_settings().outbox.relay_batch_size):
            if self._stop.is_set():
                break
            message = self._next(claimed, seq + 1)
            if message is None:
                break
            # Each delivery's record renews the lease; a send starts with at least two thirds
            # of it left, or after renewing it (and not at all if another relay holds the key).
            if time.monotonic() - renewed > lease / 3:
                if not outbox_rows.extend_lease(self.alias, claimed.cursor_id, token, lease):
                    return
                renewed = time.monotonic()
            step = self._step(claimed, token, config, destination, message)
            if step == "delivered":
                renewed = time.monotonic()  # its record renewed the lease
            elif step != "next":
                return  # the key is given back (retry, held) or no longer ours
            seq += 1
        outbox_rows.release_lease(self.alias, claimed.cursor_id, token)

    def _next(self, claimed: ClaimedKey, seq: int) -> OutboxMessage | None:
        from ..models import OutboxMessage

        return (
            OutboxMessage.objects.using(self.alias)
            .filter(destination=claimed.destination, key=claimed.key, seq=seq)
            .first()
        )

    def _step(
        self,
        claimed: ClaimedKey,
        token: str,
        config: DestinationConfig,
        destination: Destination,
        message: OutboxMessage,
    ) -> str:
        """Send one message and record it: "delivered", "next" (passed over), "wait" or "lost"."""
        from ..models import OutboxState

        if message.state != OutboxState.PENDING:
            # Settled already (a dead message of a "skip" destination, or one settled by hand):
            # its key moves on, or stays held behind a dead one of a "hold" destination.
            hold = message.state == OutboxState.DEAD and config.on_failure == "hold"
            return self._settle(claimed, token, message, hold=hold, changes=None)
        try:
            destination.send(message_envelope(message))
        except Exception as exc:
            return self._failed(claimed, token, config, message, exc)
        return self._delivered(claimed, token, message)

    def _delivered(self, claimed: ClaimedKey, token: str, message: OutboxMessage) -> str:
        from ..models import OutboxMessage, OutboxState

        lease = get_settings().outbox.relay_lease
        with transaction.atomic(using=self.alias):
            if not outbox_rows.record_delivered(self.alias, claimed.cursor_id, token, message.seq, lease):
                return "lost"
            OutboxMessage.objects.using(self.alias).filter(pk=message.pk).update(
                state=OutboxState.DELIVERED,
                attempts=F("attempts") + 1,
                delivered_at=timezone.now(),
                next_attempt_at=None,
            )
        with self._lock:
            self.delivered += 1
        # Commit to delivery: published_at is the publishing transaction's database time.
        lag = max((timezone.now() - message.published_at).total_seconds(), 0.0)
        events.emit(OutboxDelivered(message.destination, lag))
        logger.debug(
            "outbox_delivered destination=%s key=%r seq=%d message_id=%s",
            message.destination,
            message.key,
            message.seq,
            message.message_id,
        )
        return "delivered"

    def _failed(
        self,
        claimed: ClaimedKey,
        token: str,
        config: DestinationConfig,
        message: OutboxMessage,
        exc: Exception,
    ) -> str:
        from ..models import OutboxMessage, OutboxState

        if isinstance(exc, PermanentDeliveryError):
            category = PERMANENT
        elif isinstance(exc, TransientDeliveryError):
            category = TRANSIENT
        else:
            category = get_settings().unclassified_errors
            logger.warning(
                "outbox_send_raised destination=%s key=%r seq=%d error_class=%s treated_as=%s",
                message.destination,
                message.key,
                message.seq,
                type(exc).__name__,
                category,
                exc_info=exc,
            )
        attempts = message.attempts + 1
        error = _error_text(exc)
        retried = category == TRANSIENT and attempts < config.max_attempts
        events.emit(OutboxFailed(message.destination, category, retried))
        if retried:
            requested = requested_delay(exc)
            delay = requested if requested is not None else backoff(config.retry, attempts)
            with transaction.atomic(using=self.alias):
                if not outbox_rows.release_lease(self.alias, claimed.cursor_id, token, delay):
                    return "lost"
                OutboxMessage.objects.using(self.alias).filter(pk=message.pk).update(
                    attempts=attempts,
                    last_error=error,
                    next_attempt_at=timezone.now() + datetime.timedelta(seconds=delay),
                )
            logger.warning(
                "outbox_retry destination=%s key=%r seq=%d message_id=%s attempt=%d delay=%.1f error=%s",
                message.destination,
                message.key,
                message.seq,
                message.message_id,
                attempts,
                delay,
                error,
            )
            return "wait"
        hold = config.on_failure == "hold"
        changes = {
            "state": OutboxState.DEAD,
            "attempts": attempts,
            "last_error": error,
            "next_attempt_at": None,
        }
        step = self._settle(claimed, token, message, hold=hold, changes=changes)
        if step != "lost":
            events.emit(OutboxDead(message.destination, hold))
            logger.error(
                "outbox_message_dead destination=%s key=%r seq=%d message_id=%s attempts=%d category=%s "
                "on_failure=%s error=%s",
                message.destination,
                message.key,
                message.seq,
                message.message_id,
                attempts,
                category,
                config.on_failure,
                error,
            )
        return step

    def _settle(
        self,
        claimed: ClaimedKey,
        token: str,
        message: OutboxMessage,
        *,
        hold: bool,
        changes: dict[str, Any] | None,
    ) -> str:
        """Pass over a settled message ("next") or hold its key ("wait"); write ``changes`` to it, if any."""
        from ..models import OutboxCursor, OutboxMessage

        cursor_changes: dict[str, Any] = (
            {"held_seq": message.seq, "lease_token": "", "lease_until": None}
            if hold
            else {"delivered_seq": message.seq}
        )
        with transaction.atomic(using=self.alias):
            won = (
                OutboxCursor.objects.using(self.alias)
                .filter(pk=claimed.cursor_id, lease_token=token, delivered_seq=message.seq - 1)
                .update(**cursor_changes)
            )
            if not won:
                return "lost"
            if changes:
                OutboxMessage.objects.using(self.alias).filter(pk=message.pk).update(**changes)
        return "wait" if hold else "next"


def _close_all(own: dict[str, Destination]) -> None:
    for name, destination in own.items():
        try:
            destination.close()
        except Exception:
            logger.warning("outbox_destination_close_failed destination=%s", name, exc_info=True)
    own.clear()


def start(
    spawn: Callable[[Callable[[], None], str], threading.Thread], alias: str, worker_id: str
) -> Relay | None:
    """Start the relay on a thread ``spawn`` makes (the worker's, which watches its threads).

    None when ``OUTBOX["RELAY"]`` is off or no destination is declared.
    """
    conf = get_settings().outbox
    if not conf.relay or not conf.destinations:
        return None
    relay = Relay(alias, worker_id)
    relay.thread = spawn(relay.run, "jobguard-outbox-relay")
    logger.info(
        "outbox_relay_started worker_id=%s destinations=%s threads=%d",
        worker_id,
        ",".join(relay.destinations),
        relay.concurrency,
    )
    return relay


def message_envelope(message: OutboxMessage, attempt: int | None = None) -> Envelope:
    """The envelope the relay sends for ``message`` (for tools that resend by hand)."""
    return Envelope(
        id=str(message.message_id),
        destination=message.destination,
        key=message.key,
        seq=message.seq,
        payload=message.payload,
        headers=message.headers,
        published_at=message.published_at,
        attempt=attempt if attempt is not None else message.attempts + 1,
    )
