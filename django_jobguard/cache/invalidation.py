"""``invalidate()``: delete cache keys after the write's transaction commits."""

from __future__ import annotations

from django.core.cache import caches
from django.db import transaction

from ..conf import get_settings
from ._entries import alias_of, check_keys, check_version, delete_entries
from .durable import invalidate_durably


def invalidate(
    *keys: str,
    version: int | None = None,
    using: str | None = None,
    cache_alias: str | None = None,
    durable: bool | None = None,
) -> None:
    """Delete cache ``keys`` once the current transaction on database ``using`` commits.

    - Inside ``transaction.atomic(using=using)``: nothing happens until the outermost block
      commits, and nothing at all if it (or the savepoint the call was made in) rolls back.
      In autocommit the keys are deleted at once. This is ``transaction.on_commit``.
    - ``version``: the version the write committed (a row's revision counter, an event
      sequence). Instead of a plain delete each key is replaced by a tombstone that lives
      ``JOBGUARD["CACHE"]["TOMBSTONE_TTL"]`` seconds and makes :func:`set_versioned` refuse
      values older than ``version``, so a reader that loaded the old row cannot put it back.
    - ``using``: the database alias of the transaction (Django's default when None). In a
      job handler, that is the alias the worker's transaction runs on.
    - ``cache_alias``: default ``JOBGUARD["CACHE"]["ALIAS"]``.
    - ``durable``: also write the keys to a job in this transaction (default
      ``JOBGUARD["CACHE"]["DURABLE"]``), so that a worker deletes them if this process
      dies before the delete or the cache does not answer. The write must run on
      ``JOBGUARD["DATABASE_ALIAS"]``, where the job table is.

    A failing cache is logged with the keys and counted, never raised: the write it follows
    has already committed. Bad arguments (a key that is not a string, an unknown cache alias)
    raise at once, before anything is scheduled.
    """
    names = check_keys(keys)
    if version is not None:
        version = check_version(version)
    alias = alias_of(cache_alias)
    caches[alias]  # an unknown alias raises InvalidCacheBackendError here, in the caller
    if durable is None:
        durable = get_settings().cache.durable
    elif not isinstance(durable, bool):
        raise ValueError(f"durable is True, False or None, not {durable!r}")
    if not names:
        return
    if durable:
        invalidate_durably(names, version, alias, using)
        return
    transaction.on_commit(lambda: _invalidate_now(names, version, alias), using=using)


def _invalidate_now(keys: list[str], version: int | None, alias: str) -> None:
    delete_entries(alias, dict.fromkeys(keys, version))
