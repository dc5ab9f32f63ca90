"""Cache invalidation that follows the write path, and versioned cache writes.

Three tools, for values cached from rows of the database:

- :func:`invalidate` deletes cache keys **after the transaction commits**
  (``transaction.on_commit``): a write that rolls back deletes nothing, and a reader cannot
  refill the key from the old row before the new one is visible. Deleting instead of
  writing the new value means a late invalidation can never put an old value back.
- :func:`invalidates` declares it once per model: saving or deleting an instance (and
  changing its many-to-many fields) invalidates the keys formatted from it.
- :func:`set_versioned` / :func:`get_versioned` store a value with an integer version and
  refuse a write whose version is not newer than the one the cache holds. Together with
  ``invalidate(key, version=v)``, which leaves a short-lived *tombstone* carrying the
  version, this closes the classic race of a reader that loaded the old row before a
  writer committed and fills the cache after the writer invalidated it.

On django-redis the compare-and-set and the tombstone are Lua scripts, atomic on the
server across every process. Other back ends get a process-local lock around a read and a
write: exact within one process (local memory, the embedded default, is per process
anyway), but two *processes* sharing a file, database or memcached cache can interleave
between the read and the write. The limits are spelled out in
``docs/how-to/cache-invalidation.md``.

A cache that fails during an invalidation (Redis down) is logged with the keys and counted
as ``jobguard_cache_invalidations_total{status="error"}``; it is never raised into the
request or job, whose write has already committed.

Two more tools close the gaps of a delete after ``on_commit``:

- ``invalidate(..., durable=True)`` also writes the keys to a job, inserted in the writer's
  transaction (so it exists exactly when the write committed). After the commit the keys
  are deleted at once as usual and the job is deleted in the same callback; if the process
  died first, or the cache did not answer, the job is still there and a worker
  (:data:`delete_keys`, queue ``JOBGUARD["CACHE"]["QUEUE"]``) deletes the keys, retrying
  with backoff while the cache is unreachable. All durable keys of one transaction go into
  one job.
- :func:`get_or_set` refills a missing key under a short *refill lease*, so that of many
  concurrent misses of one key one calls the loader and the others wait for its value.
"""

from ._entries import MAX_VERSION, Versioned
from .declared import Invalidation, declarations, invalidates
from .durable import delete_keys
from .invalidation import invalidate
from .refill import REFILL_LEASE_PREFIX, REFILL_POLL_SECONDS, get_or_set
from .versioned import get_versioned, set_versioned

__all__ = [
    "MAX_VERSION",
    "REFILL_LEASE_PREFIX",
    "REFILL_POLL_SECONDS",
    "Invalidation",
    "Versioned",
    "declarations",
    "delete_keys",
    "get_or_set",
    "get_versioned",
    "invalidate",
    "invalidates",
    "set_versioned",
]
