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

A destination that names a limit (``LIMIT``: an entry of ``JOBGUARD["LIMITS"]``, as
``@task(limit=...)``) is held to it as that limit's tasks are, with their state: at most its
``concurrency`` keys of the destinations naming it in flight across the fleet (counted at
claim), at most its ``rate`` of sends, and its ``breaker``: each send is a call (a transient
failure a failed one); open, the relay claims none of its keys and sends nothing; after
``open_for``, ``probes`` sends go out, and the first to succeed closes it. A send the limit
does not admit now gives its key back, with no attempt counted and the message untouched
(its key's order holds); other destinations are not held up.

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

from .. import breakers, events, store
from ..conf import DestinationConfig, get_settings
from ..flow import BreakerGate, NamedLimit, RateSpec
from ..retry import PERMANENT, TRANSIENT, backoff, requested_delay
from ..store import outbox as outbox_rows
from ..store.outbox import Bound, ClaimedKey, SendAdmission
from .destinations.base import Destination, Envelope, PermanentDeliveryError, TransientDeliveryError
from .events import OutboxDead, OutboxDelivered, OutboxFailed, OutboxThrottled
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
        #: Sends a limit did not admit, by reason ("breaker", "budget", "rate"; for tests).
        self.throttled: dict[str, int] = {}
        # Successes of closed breakers not counted yet, by limit, and since when.
        self._successes = breakers.HeldSuccesses()
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
                # Claim again when a thread frees (its key may have more, or others may wait),
                # else after the poll interval; stop() sets the event too.
                self._freed.wait(get_settings().outbox.relay_poll_interval)
        finally:
            for _ in threads:
                self._keys.put(None)
            deadline = time.monotonic() + JOIN_SECONDS  # one wait for all: shutdown stays bounded
            for thread in threads:
                thread.join(timeout=max(deadline - time.monotonic(), 0.0))
            connections[self.alias].close()

    def claim(self, token: str, limit: int) -> list[ClaimedKey]:
        """Lease up to ``limit`` keys that have messages to deliver (under ``token``).

        Not those of a destination whose limit admits no send now (breaker open, rate ahead),
        nor more keys of the destinations of a limit than its concurrency leaves room for.
        """
        lease = get_settings().outbox.relay_lease
        limits = destination_limits()
        names = self.destinations
        if limits:
            named = {limit.name: limit for limit in limits.values()}
            guards = {name: gate for name, limit in named.items() if (gate := _gate(limit)) is not None}
            rates = {name: RateSpec.of(limit.rate) for name, limit in named.items() if limit.rate is not None}
            closed = outbox_rows.closed_limits(_limits_alias(), guards, rates)
            names = [name for name in names if name not in limits or limits[name].name not in closed]
        return outbox_rows.claim_keys(self.alias, names, token, lease, limit, bounds(limits))

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
        for message in self._pending(claimed, get_settings().outbox.relay_batch_size):
            if self._stop.is_set() or message.seq != seq + 1:
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

    def _pending(self, claimed: ClaimedKey, count: int) -> list[OutboxMessage]:
        """The key's next ``count`` messages after its ``delivered_seq``, in order: one read per
        key, not per message. While the key's lease is ours, only this relay settles them (an
        operator acts on dead messages only, and a replay of a passed-over one publishes a copy
        at the end), so what was read stays true; messages published since wait for the next claim.
        """
        from ..models import OutboxMessage

        return list(
            OutboxMessage.objects.using(self.alias)
            .filter(destination=claimed.destination, key=claimed.key, seq__gt=claimed.delivered_seq)
            .order_by("seq")[:count]
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
        limit = get_settings().limits.get(config.limit) if config.limit else None
        state = "closed"
        if limit is not None:
            admission = self._admit(limit, message)
            if not admission.admitted:
                return self._throttled(claimed, token, message, admission)
            state = admission.state
        try:
            destination.send(message_envelope(message))
        except Exception as exc:
            step = self._failed(claimed, token, config, message, exc)
            if limit is not None:
                self._call(limit, state, exc)
            return step
        step = self._delivered(claimed, token, message)
        if limit is not None:
            self._call(limit, state, None)
        return step

    def _admit(self, limit: NamedLimit, message: OutboxMessage) -> SendAdmission:
        """Pass ``limit``'s breaker, retry budget and rate for one send of ``message``."""
        rate = RateSpec.of(limit.rate) if limit.rate is not None else None
        admission = outbox_rows.admit_send(_limits_alias(), limit.name, _gate(limit), rate, message.attempts)
        for name, before, after in admission.changes:
            breakers.report_change(name, before, after, "system", "open time over: probing the dependency")
        return admission

    def _throttled(
        self, claimed: ClaimedKey, token: str, message: OutboxMessage, admission: SendAdmission
    ) -> str:
        """Give the key back unsent: no attempt counted, the message as it was."""
        with self._lock:
            self.throttled[admission.reason] = self.throttled.get(admission.reason, 0) + 1
        events.emit(OutboxThrottled(message.destination, admission.reason))
        logger.debug(
            "outbox_throttled destination=%s key=%r seq=%d reason=%s retry_in=%s",
            message.destination,
            message.key,
            message.seq,
            admission.reason,
            "-" if admission.retry_in is None else f"{admission.retry_in:.2f}",
        )
        if not outbox_rows.release_lease(self.alias, claimed.cursor_id, token, admission.retry_in):
            return "lost"
        return "wait"

    def _call(self, limit: NamedLimit, state: str, error: Exception | None) -> None:
        """Count one send as a call of ``limit``'s breaker (a transient failure is a failed one).

        Successes while the breaker is closed are gathered and counted with the next count
        (:class:`~django_jobguard.breakers.HeldSuccesses`); a lost count only delays a trip.
        """
        spec = limit.breaker
        if spec is None:
            return
        failed = error is not None and (
            isinstance(error, TransientDeliveryError)
            or breakers.is_failed_call(error, _category(error), None, spec)
        )
        name = limit.name
        with self._lock:
            held = self._successes.take(name, failed=failed, closed=state == "closed", now=time.monotonic())
        if held is None:
            return
        try:
            breakers.record(_limits_alias(), name, spec, failed=failed, earlier_successes=held)
        except (DatabaseError, InterfaceError):
            logger.warning("breaker_count_failed limit=%s", name, exc_info=True)

    def _delivered(self, claimed: ClaimedKey, token: str, message: OutboxMessage) -> str:
        from ..models import OutboxMessage, OutboxState

        lease = get_settings().outbox.relay_lease
        with transaction.atomic(using=self.alias):
            # A record lost to a database crash only sends the message again, with its id (at
            # least once): the commit need not wait for the disk.
            store.asynchronous_commit(self.alias)
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

        category = _category(exc)
        if not isinstance(exc, PermanentDeliveryError | TransientDeliveryError):
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


def _category(exc: BaseException) -> str:
    """A send's error as the relay classifies it: permanent, transient, or the settings' default."""
    if isinstance(exc, PermanentDeliveryError):
        return PERMANENT
    if isinstance(exc, TransientDeliveryError):
        return TRANSIENT
    return get_settings().unclassified_errors


def _limits_alias() -> str:
    # Breakers and rates live with the jobs (where the tasks' claims, the admin and the
    # metrics read them), wherever the outbox's own tables are.
    return get_settings().database_alias


def _gate(limit: NamedLimit) -> BreakerGate | None:
    if limit.breaker is None and limit.retry_budget is None:
        return None
    return BreakerGate(limit.breaker, limit.retry_budget)


def destination_limits() -> dict[str, NamedLimit]:
    """The limit each destination that names one is held to, by destination."""
    conf = get_settings()
    return {
        name: conf.limits[config.limit]
        for name, config in conf.outbox.destinations.items()
        if config.limit is not None and config.limit in conf.limits
    }


def bounds(limits: dict[str, NamedLimit]) -> list[Bound]:
    """The concurrency of each limit with one, over the destinations that name it."""
    grouped: dict[str, list[str]] = {}
    for destination, limit in sorted(limits.items()):
        if limit.concurrency is not None:
            grouped.setdefault(limit.name, []).append(destination)
    return [
        Bound(name, concurrency, tuple(names))
        for name, names in grouped.items()
        if (concurrency := get_settings().limits[name].concurrency) is not None
    ]


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
