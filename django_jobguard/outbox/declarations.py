"""``publishes()``: declare once per model the events its writes publish, in the write's transaction.

The shape of :func:`django_jobguard.cache.invalidates`, with the outbox's guarantee: the event
is written by :func:`~django_jobguard.outbox.publish` *inside* the transaction of the write,
not after its commit, so a row and its event commit together or not at all.

- **Saves.** ``post_save`` publishes ``created`` or ``updated``. Django runs ``post_save``
  after the write's own transaction in autocommit, so a declared model's ``save_base`` is
  wrapped in ``transaction.atomic(savepoint=False)`` (what Django already does for a model
  with parents): the row, the ``post_save`` receivers and the event share one transaction
  even outside ``atomic()``, at the cost of nothing inside one.
- **Deletes.** ``post_delete`` publishes ``deleted``: Django sends it inside the deletion's
  own transaction, with the instance's fields still set, for ``instance.delete()`` and for
  ``QuerySet.delete()`` (one event per row, since a receiver makes Django load the rows).
- **Not published**, as no signal fires: ``QuerySet.update()``, ``bulk_create()``,
  ``bulk_update()``, raw SQL; nor ``loaddata`` (``raw`` saves: fixtures are not writes of
  the application); nor many-to-many changes. Publish those with ``publish()``.

A write on another database than the outbox's (``JOBGUARD["DATABASE_ALIAS"]``) could not
share its transaction: it is refused before anything is written, and
:mod:`django_jobguard.checks.outbox` reports the model at startup (``jobguard.E061``), with
an undeclared destination, a field the model does not have, a bad key template or header.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import string
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router, transaction
from django.db.models.fields.files import FieldFile
from django.db.models.signals import post_delete, post_save, pre_delete

from .._text import InstanceFields
from ..conf import get_settings
from ..exceptions import InvalidPublishError

__all__ = [
    "DEFAULT_KEY",
    "EVENTS",
    "EVENT_HEADER",
    "MODEL_HEADER",
    "EventDeclaration",
    "declarations",
    "problems",
    "publishes",
    "template_fields",
]

#: What a declaration may publish on: a row inserted, updated or deleted.
EVENTS = ("created", "updated", "deleted")
#: The header that says which of :data:`EVENTS` a declared message reports.
EVENT_HEADER = "jobguard-event"
#: The header naming the model (``app_label.modelname``) a declared message comes from.
MODEL_HEADER = "jobguard-model"

KeySource = str | Callable[[Any], str | None] | None
PayloadSource = str | Iterable[str] | Callable[[Any], Any]
HeaderSource = Mapping[str, str] | Callable[[Any], Mapping[str, str]] | None

_uids = itertools.count(1)
_declarations: list[EventDeclaration] = []
_lock = threading.Lock()
#: Models whose save_base this module wrapped, with how many declarations need it.
_wrapped: dict[type[models.Model], int] = {}
_ORIGINAL = "_jobguard_outbox_original_save_base"
_MISSING = object()
#: ``publishes()``'s default key: ``"app_label.modelname:{pk}"``, each row's events in order.
DEFAULT_KEY: Any = object()
_encoder = DjangoJSONEncoder()


def template_fields(template: str) -> list[str]:
    """The attribute names a key template reads (``"order:{pk}:{customer.id}"``: pk, customer)."""
    names = []
    for _literal, field, _spec, _conversion in string.Formatter().parse(template):
        if field is not None:
            names.append(field.split(".", 1)[0].split("[", 1)[0])
    return names


def _plain(value: Any) -> Any:
    """A field's value as JSON: ISO 8601 times, decimals and UUIDs as strings (DjangoJSONEncoder's
    forms, but times keep their microseconds: the encoder cuts them to milliseconds)."""
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    if isinstance(value, datetime.datetime | datetime.time):
        return value.isoformat()
    if isinstance(value, FieldFile):
        return value.name or None
    try:
        return _encoder.default(value)
    except TypeError:
        return value  # publish() refuses it, naming the field


@dataclasses.dataclass(eq=False)
class EventDeclaration:
    """A declaration made by :func:`publishes`; :meth:`disconnect` undoes it."""

    model: type[models.Model]
    destinations: tuple[str, ...]
    key: KeySource
    payload: PayloadSource
    headers: HeaderSource
    on: frozenset[str]
    uid: str
    _connected: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        """``publishes(app_label.Model)``: how errors and checks name this declaration."""
        return f"publishes({self.model._meta.label})"

    def key_for(self, instance: models.Model) -> str | None:
        """The message key of ``instance``'s events."""
        if self.key is None:
            return None
        if isinstance(self.key, str):
            try:
                return self.key.format_map(InstanceFields(instance))
            except KeyError as exc:
                raise InvalidPublishError(
                    f"{self.label}: key template {self.key!r}: "
                    f"{type(instance).__name__} has no attribute {exc}"
                ) from None
        return self.key(instance)

    def payload_for(self, instance: models.Model) -> Any:
        """The payload of ``instance``'s events: its fields as a dict, or what the method returns."""
        source = self.payload
        if callable(source):
            return source(instance)
        if isinstance(source, str):
            return getattr(instance, source)()
        values: dict[str, Any] = {}
        for name in source:
            if name == "pk":
                values[name] = _plain(instance.pk)
            else:
                field = instance._meta.get_field(name)
                values[name] = _plain(field.value_from_object(instance))  # type: ignore[union-attr]
        return values

    def headers_for(self, instance: models.Model, event: str) -> dict[str, str]:
        """The declared headers, then :data:`EVENT_HEADER` and :data:`MODEL_HEADER`."""
        given = self.headers(instance) if callable(self.headers) else self.headers
        return {**(given or {}), EVENT_HEADER: event, MODEL_HEADER: self.model._meta.label_lower}

    def publish_for(self, instance: models.Model, event: str, using: str) -> None:
        """Publish ``instance``'s ``event`` to each destination, in the write's transaction on ``using``."""
        from .publisher import publish

        if event not in self.on:
            return
        _check_alias(self.model, using)
        key = self.key_for(instance)
        payload = self.payload_for(instance)
        headers = self.headers_for(instance, event)
        if not transaction.get_connection(using).in_atomic_block:
            # The write committed on its own (save_base replaced since publishes() wrapped it):
            # said loudly rather than published in a transaction of its own.
            raise InvalidPublishError(
                f"{self.label}: the {event} write was not in a transaction, so its event could not "
                "share it; save inside transaction.atomic()."
            )
        for destination in self.destinations:
            publish(destination, payload, key=key, headers=headers)

    def _saved(self, sender: Any, instance: models.Model, created: bool, using: str, **kwargs: Any) -> None:
        if kwargs.get("raw"):  # loaddata: fixtures are not writes of the application
            return
        self.publish_for(instance, "created" if created else "updated", using)

    def _deleting(self, sender: Any, instance: models.Model, using: str, **kwargs: Any) -> None:
        # Before the DELETE: a write on another database is refused with nothing deleted.
        _check_alias(self.model, using)

    def _deleted(self, sender: Any, instance: models.Model, using: str, **kwargs: Any) -> None:
        self.publish_for(instance, "deleted", using)

    def connect(self) -> None:
        """Connect the receivers and wrap the model's saves in a transaction (done by :func:`publishes`)."""
        pairs: list[tuple[Any, Any]] = []
        if self.on & {"created", "updated"}:
            pairs.append((post_save, self._saved))
            _wrap_saves(self.model)
        if "deleted" in self.on:
            pairs += [(pre_delete, self._deleting), (post_delete, self._deleted)]
        for signal, receiver in pairs:
            signal.connect(receiver, sender=self.model, weak=False, dispatch_uid=self.uid)
            self._connected.append((signal, receiver))
        with _lock:
            _declarations.append(self)

    def disconnect(self) -> None:
        """Disconnect the receivers: writes of the model no longer publish these events."""
        for signal, _receiver in self._connected:
            signal.disconnect(sender=self.model, dispatch_uid=self.uid)
        if any(signal is post_save for signal, _ in self._connected):
            _unwrap_saves(self.model)
        self._connected.clear()
        with _lock:
            if self in _declarations:
                _declarations.remove(self)


def _check_alias(model: type[models.Model], using: str) -> None:
    from .publisher import outbox_alias

    alias = outbox_alias()
    if using != alias:
        raise InvalidPublishError(
            f"publishes({model._meta.label}): this write runs on database {using!r}, the outbox on "
            f"{alias!r} (JOBGUARD['DATABASE_ALIAS']): the event could not share the write's "
            "transaction, so nothing was written. Keep the model on the outbox's database."
        )


def _wrap_saves(model: type[models.Model]) -> None:
    """Run ``model``'s saves in a transaction, so that ``post_save`` (and its event) shares the write's."""
    with _lock:
        if _wrapped.get(model):
            _wrapped[model] += 1
            return
        _wrapped[model] = 1
        own = model.__dict__.get("save_base", _MISSING)
        inherited = model.save_base

        def save_base(self: models.Model, *args: Any, **kwargs: Any) -> Any:
            using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
            if kwargs.get("raw"):
                return inherited(self, *args, **kwargs)
            _check_alias(model, using)  # before the write: nothing is written
            with transaction.atomic(using=using, savepoint=False):
                return inherited(self, *args, **kwargs)

        save_base.__doc__ = inherited.__doc__
        setattr(save_base, _ORIGINAL, own)
        model.save_base = save_base  # type: ignore[method-assign]


def _unwrap_saves(model: type[models.Model]) -> None:
    with _lock:
        count = _wrapped.get(model, 0)
        if count > 1:
            _wrapped[model] = count - 1
            return
        _wrapped.pop(model, None)
        own = getattr(model.__dict__.get("save_base"), _ORIGINAL, _MISSING)
        if own is _MISSING:
            del model.save_base
        else:
            setattr(model, "save_base", own)  # noqa: B010 - a value of any type, put back as it was


def _destinations(destination: str | Iterable[str]) -> tuple[str, ...]:
    names = (destination,) if isinstance(destination, str) else tuple(destination)
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"publishes() takes a destination name or a list of them, not {destination!r}")
    return names


def publishes(
    model: type[models.Model],
    destination: str | Iterable[str],
    *,
    key: KeySource = DEFAULT_KEY,
    payload: PayloadSource,
    headers: HeaderSource = None,
    on: Iterable[str] = EVENTS,
) -> EventDeclaration:
    """Declare that writing a ``model`` instance publishes an event, in the write's transaction.

    - ``destination``: a name declared in ``JOBGUARD["OUTBOX"]["DESTINATIONS"]``, or a list
      of them (one message each, same key and payload).
    - ``key``: a template formatted with the instance's attributes (``"order:{pk}"``,
      ``"customer:{customer_id}"``), a callable taking the instance, or None (each event a
      key of its own: no order). The default, ``"app_label.modelname:{pk}"``, orders each
      row's events; events of one key are delivered in commit order.
    - ``payload``: field names (``["id", "status", "total"]``: a dict of their values as JSON,
      dates and times in ISO 8601, decimals as strings, a foreign key as its id), the name of a
      method of the model (called with no argument), or a callable taking the instance.
    - ``headers``: a dict of strings, or a callable taking the instance. Each message also
      carries ``jobguard-event`` (``created``, ``updated`` or ``deleted``) and
      ``jobguard-model`` (``app_label.modelname``).
    - ``on``: which of ``created``, ``updated``, ``deleted`` publish (all three by default).

    A save or delete whose event ``publish()`` refuses (a payload that is not JSON, a key
    over its limit) raises :class:`~django_jobguard.exceptions.InvalidPublishError` and is
    rolled back with it. See the module's docstring for what does not publish
    (``QuerySet.update()``, ``bulk_create()``...). Call it once, at import time (a
    ``models.py`` or ``AppConfig.ready()``); ``manage.py check`` validates it against the
    model and the settings. It returns the :class:`EventDeclaration`, whose ``disconnect()``
    undoes it.
    """
    if not (isinstance(model, type) and issubclass(model, models.Model)):
        raise TypeError(f"publishes() takes a model class, not {model!r}")
    destinations = _destinations(destination)
    if key is DEFAULT_KEY:
        key = f"{model._meta.label_lower}:{{pk}}"
    elif not (key is None or callable(key) or (isinstance(key, str) and key)):
        raise ValueError(f"key is a template string, a callable or None, not {key!r}")
    if not (callable(payload) or isinstance(payload, str)):
        if isinstance(payload, Mapping) or not isinstance(payload, Iterable):
            raise ValueError(
                "payload is a list of field names, a method name or a callable taking the instance, "
                f"not {payload!r}"
            )
        payload = tuple(payload)
        if not payload or not all(isinstance(name, str) for name in payload):
            raise ValueError(f"payload names at least one field, as strings, not {payload!r}")
    if headers is not None and not (callable(headers) or isinstance(headers, Mapping)):
        raise ValueError(f"headers is a dict of strings or a callable, not {headers!r}")
    events = frozenset((on,) if isinstance(on, str) else on)
    if not events or not events <= set(EVENTS):
        raise ValueError(f"on takes some of {', '.join(EVENTS)}, not {on!r}")
    declaration = EventDeclaration(
        model=model,
        destinations=destinations,
        key=key,
        payload=payload,
        headers=headers if callable(headers) or headers is None else dict(headers),
        on=events,
        uid=f"jobguard_outbox_publishes_{model._meta.label_lower}_{next(_uids)}",
    )
    declaration.connect()
    return declaration


def declarations() -> list[EventDeclaration]:
    """The declarations made with :func:`publishes` and still connected."""
    with _lock:
        return list(_declarations)


def problems(declaration: EventDeclaration) -> list[str]:
    """What is wrong with ``declaration`` against its model and the settings (for the system check)."""
    from .publisher import _check_headers, outbox_alias

    found: list[str] = []
    model = declaration.model
    if model._meta.abstract:
        # Signals name the class saved: an abstract model's subclasses would never publish.
        found.append(f"{model.__name__} is abstract: declare the events on each model that is saved")
    declared = get_settings().outbox.destinations
    for name in declaration.destinations:
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            found.append(
                f"destination {name!r} is not declared in JOBGUARD['OUTBOX']['DESTINATIONS'] "
                f"(declared: {known})"
            )
    if isinstance(declaration.key, str):
        try:
            names = template_fields(declaration.key)
        except ValueError as exc:
            found.append(f"key template {declaration.key!r} cannot be formatted: {exc}")
        else:
            for name in names:
                if not name or not (name == "pk" or _has_field(model, name) or hasattr(model, name)):
                    found.append(
                        f"key template {declaration.key!r} names {name!r}, which {model.__name__} lacks"
                    )
    payload = declaration.payload
    if isinstance(payload, str):
        if not callable(getattr(model, payload, None)):
            found.append(f"payload names the method {payload!r}, which {model.__name__} lacks")
    elif not callable(payload):
        for name in payload:
            if name == "pk":
                continue
            try:
                field = model._meta.get_field(name)
            except FieldDoesNotExist:
                found.append(f"payload names the field {name!r}, which {model.__name__} lacks")
                continue
            if field.many_to_many or field.one_to_many or not field.concrete:
                found.append(f"payload field {name!r} is not a column of {model.__name__} (a relation)")
            elif isinstance(field, models.BinaryField):
                found.append(f"payload field {name!r} is binary, which JSON cannot carry")
    if isinstance(declaration.headers, Mapping):
        try:
            _check_headers(declaration.headers)
        except InvalidPublishError as exc:
            found.append(str(exc).rstrip("."))
    written_on = router.db_for_write(model)
    alias = outbox_alias()
    if written_on != alias:
        found.append(
            f"{model.__name__} is written on database {written_on!r}, the outbox on {alias!r} "
            "(JOBGUARD['DATABASE_ALIAS']): its events could not share the write's transaction"
        )
    return found


def _has_field(model: type[models.Model], name: str) -> bool:
    try:
        model._meta.get_field(name)
    except FieldDoesNotExist:
        return any(field.attname == name for field in model._meta.concrete_fields)
    return True
