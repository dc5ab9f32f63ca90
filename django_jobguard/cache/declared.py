"""``invalidates()``: declare once per model which cache keys its writes invalidate (model signals)."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save

from .._text import InstanceFields
from .invalidation import invalidate

KeySource = str | Callable[[Any], Iterable[str]]
VersionSource = str | Callable[[Any], int] | None


_uids = itertools.count(1)
_declarations: list[Invalidation] = []
_declarations_lock = threading.Lock()


@dataclasses.dataclass(eq=False)
class Invalidation:
    """A declaration made by :func:`invalidates`; :meth:`disconnect` undoes it."""

    model: type[models.Model]
    keys: tuple[KeySource, ...]
    version: VersionSource
    cache_alias: str | None
    uid: str
    durable: bool | None = None
    _connected: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)

    def keys_for(self, instance: models.Model) -> list[str]:
        """The cache keys ``instance`` invalidates."""
        found: list[str] = []
        for source in self.keys:
            if isinstance(source, str):
                try:
                    found.append(source.format_map(InstanceFields(instance)))
                except KeyError as exc:
                    raise ValueError(
                        f"cache key template {source!r}: {type(instance).__name__} has no attribute {exc}"
                    ) from None
            else:
                found.extend(source(instance))
        return found

    def version_for(self, instance: models.Model) -> int | None:
        """The version passed to :func:`invalidate` for ``instance`` (None: a plain delete)."""
        if self.version is None:
            return None
        if isinstance(self.version, str):
            return int(getattr(instance, self.version))
        return self.version(instance)

    def _invalidate(self, instances: Iterable[models.Model], using: str | None) -> None:
        for instance in instances:
            keys = self.keys_for(instance)
            if keys:
                invalidate(
                    *keys,
                    version=self.version_for(instance),
                    using=using,
                    cache_alias=self.cache_alias,
                    durable=self.durable,
                )

    def _saved_or_deleted(self, sender: Any, instance: models.Model, using: str, **kwargs: Any) -> None:
        if kwargs.get("raw"):  # loaddata: fixtures are not writes of the application
            return
        self._invalidate([instance], using)

    def _m2m_changed(
        self,
        sender: Any,
        instance: models.Model,
        action: str,
        reverse: bool,
        model: type[models.Model],
        pk_set: set[Any] | None,
        using: str,
        **kwargs: Any,
    ) -> None:
        if action not in ("post_add", "post_remove", "post_clear"):
            return
        if not reverse:
            self._invalidate([instance], using)
        elif pk_set:
            # Changed from the other side: the instances of our model are the pk_set.
            self._invalidate(self.model._default_manager.using(using).filter(pk__in=pk_set), using)

    def connect(self) -> None:
        """Connect the receivers (done by :func:`invalidates`)."""
        pairs: list[tuple[Any, Any]] = [(post_save, self.model), (post_delete, self.model)]
        for field in self.model._meta.local_many_to_many:
            pairs.append((m2m_changed, field.remote_field.through))
        for signal, sender in pairs:
            receiver = self._m2m_changed if signal is m2m_changed else self._saved_or_deleted
            signal.connect(receiver, sender=sender, weak=False, dispatch_uid=self.uid)
            self._connected.append((signal, sender))
        with _declarations_lock:
            _declarations.append(self)

    def disconnect(self) -> None:
        """Disconnect the receivers: saving the model no longer invalidates these keys."""
        for signal, sender in self._connected:
            signal.disconnect(sender=sender, dispatch_uid=self.uid)
        self._connected.clear()
        with _declarations_lock:
            if self in _declarations:
                _declarations.remove(self)


def invalidates(
    model: type[models.Model],
    *keys: KeySource,
    version: VersionSource = None,
    cache_alias: str | None = None,
    durable: bool | None = None,
) -> Invalidation:
    """Declare that saving or deleting a ``model`` instance invalidates cache ``keys``.

    Each key is a template formatted with the instance's attributes
    (``"account:{pk}:balance"``, ``"customer:{customer_id}:orders"``) or a callable that
    takes the instance and returns keys. ``post_save``, ``post_delete`` and ``m2m_changed``
    (of the model's many-to-many fields) call :func:`invalidate` on the database alias of
    the write, so the keys go after that transaction commits, and not at all if it rolls
    back. Fixtures loaded with ``loaddata`` invalidate nothing.

    ``version``: an attribute name (``"revision"``) or a callable giving the instance's
    version; the invalidation then leaves a tombstone (see :func:`invalidate`). ``durable``:
    as for :func:`invalidate` (None: ``JOBGUARD["CACHE"]["DURABLE"]``, read at each write). Writes that
    bypass signals (``QuerySet.update()``, raw SQL) need an explicit :func:`invalidate`.

    Call it once, at import time (a ``models.py`` or ``AppConfig.ready()``); it returns the
    :class:`Invalidation`, whose ``disconnect()`` undoes it.
    """
    if not (isinstance(model, type) and issubclass(model, models.Model)):
        raise TypeError(f"invalidates() takes a model class, not {model!r}")
    if not keys:
        raise ValueError("invalidates() needs at least one key template or callable")
    for source in keys:
        if not (isinstance(source, str) and source) and not callable(source):
            raise ValueError(f"a key is a template string or a callable, not {source!r}")
    if durable is not None and not isinstance(durable, bool):
        raise ValueError(f"durable is True, False or None, not {durable!r}")
    declaration = Invalidation(
        model=model,
        keys=tuple(keys),
        version=version,
        cache_alias=cache_alias,
        durable=durable,
        uid=f"jobguard_cache_invalidates_{model._meta.label_lower}_{next(_uids)}",
    )
    declaration.connect()
    return declaration


def declarations() -> list[Invalidation]:
    """The declarations made with :func:`invalidates` and still connected."""
    with _declarations_lock:
        return list(_declarations)
