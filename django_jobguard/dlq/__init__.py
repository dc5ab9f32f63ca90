"""The dead-letter queue: dead-lettering, and the replay workflow (request, approve, reject, redrive).

Admin, API and commands call these functions, imported from here; the rules live once, in
:mod:`.dead_letter` (writing a dead letter), :mod:`.transitions` (the ``ReplayState`` machine),
:mod:`.permissions` (who may make which step), :mod:`.corrections` (a replay's payload
checked, its digest, correction review), :mod:`.keys` (what the idempotency key means for a
replay), :mod:`.replay` (the user's steps) and :mod:`.redrive` (redrive under the throttle).

- :func:`request_replay` (permission ``jobguard.request_replay``; a corrected payload also
  needs ``jobguard.view_payload``) moves a dead letter from ``none`` or ``rejected`` to
  ``requested``. The payload, corrected or not, must bind to the handler's signature and be JSON.
- :func:`approve_replay` (``jobguard.approve_replay``; not by the requester unless
  ``JOBGUARD["REPLAY"]["ALLOW_SELF_APPROVAL"]``; a corrected payload also needs
  ``jobguard.view_payload``, and is bound to its :func:`correction_digest`) moves it to ``approved``;
  :func:`reject_replay` (``jobguard.approve_replay``) moves a requested or approved, not yet
  redriven, replay to ``rejected``.
- :func:`redrive`, run by every worker between claims, turns approved replays into new jobs,
  at most ``JOBGUARD["REPLAY"]["RATE_PER_MINUTE"]`` a minute across all workers (or the rate
  :func:`set_rate` stored from the console, read by every pass), and marks
  them ``replayed``. The new job keeps the idempotency key, and the key's row points at it
  under the fingerprint of the payload it runs: after a corrected replay, an enqueue of the key
  with the original arguments is an :class:`IdempotencyConflict` (docs/runbooks/dead-letters.md).
  :func:`redrive_once` makes the same pass and says what it did (:class:`RedrivePass`).
- :func:`review_correction` says what a corrected payload changes (by argument name) and
  warns when the idempotency key's fingerprint or the lock key depends on what changed.

Every transition is one transaction: a conditional update of ``replay_state`` (so of two
concurrent approvals, or two workers redriving, exactly one wins) and a :class:`ReplayEvent`
row saying who, when and why. Signals and metrics follow the commit.
"""

# Kept here for the callers that name it ``dlq.User``: the protocol lives in the leaf ``actors``.
from ..actors import User
from .corrections import ABSENT, CorrectionReview, FieldChange, correction_digest, review_correction
from .dead_letter import dead_letter
from .keys import describe_key
from .patch import MAX_PATCH_OPERATIONS, PatchError, PatchOperation, apply_patch, parse_patch
from .permissions import (
    PAYLOAD_EVENT_KEYS,
    PERMISSIONS,
    VIEW_PAYLOAD,
    available_actions,
    can_view_payload,
    check_permission,
    refusal_reason,
    replay_actions,
    visible_event_data,
)
from .rate import MAX_RATE_PER_MINUTE, RATE_PERMISSION, ReplayRate, current_rate, set_rate
from .redrive import (
    BURST_WINDOW_SECONDS,
    RATE_WINDOW_SECONDS,
    REDRIVE_LOOKAHEAD,
    THROTTLE_LOCK_KEY,
    RedriveEstimate,
    RedrivePass,
    RedriveSkip,
    redrive,
    redrive_estimate,
    redrive_once,
)
from .replay import (
    BULK_CHUNK,
    BulkDecision,
    approve_replay,
    check_review,
    decide_many,
    reject_replay,
    request_many_corrected,
    request_replay,
)
from .transitions import ALLOWED_FROM, APPROVE, LEADS_TO, REJECT, REQUEST, Transition

__all__ = [
    "ABSENT",
    "ALLOWED_FROM",
    "APPROVE",
    "BULK_CHUNK",
    "BURST_WINDOW_SECONDS",
    "LEADS_TO",
    "MAX_PATCH_OPERATIONS",
    "MAX_RATE_PER_MINUTE",
    "PAYLOAD_EVENT_KEYS",
    "PERMISSIONS",
    "RATE_PERMISSION",
    "RATE_WINDOW_SECONDS",
    "REDRIVE_LOOKAHEAD",
    "REJECT",
    "REQUEST",
    "THROTTLE_LOCK_KEY",
    "VIEW_PAYLOAD",
    "BulkDecision",
    "CorrectionReview",
    "FieldChange",
    "PatchError",
    "PatchOperation",
    "RedriveEstimate",
    "RedrivePass",
    "RedriveSkip",
    "ReplayRate",
    "Transition",
    "User",
    "apply_patch",
    "approve_replay",
    "available_actions",
    "can_view_payload",
    "check_permission",
    "check_review",
    "correction_digest",
    "current_rate",
    "dead_letter",
    "decide_many",
    "describe_key",
    "parse_patch",
    "redrive",
    "redrive_estimate",
    "redrive_once",
    "refusal_reason",
    "reject_replay",
    "replay_actions",
    "request_many_corrected",
    "request_replay",
    "review_correction",
    "set_rate",
    "visible_event_data",
]
