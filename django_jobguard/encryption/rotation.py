"""Key rotation: find the stored ciphertexts not under the current key and seal them again.

Progress is the data itself: a row is pending while one of its fields holds a ciphertext under
another key id, so an interrupted run loses nothing and the next one continues. Rows are read
in primary-key order, a batch at a time, and each batch is written in its own short transaction
with compare-and-set updates (``WHERE pk = %s AND field = <the value read>``): a worker that
writes the field in between wins, and the row is read again before the run ends.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import DatabaseError, connections, models, transaction
from django.db.models.functions import Cast

from . import TOKEN_PREFIX, DecryptionError, keyring
from .fields import ENCRYPTED_FIELDS, EncryptedField

__all__ = [
    "Failure",
    "FieldReport",
    "ReencryptReport",
    "Survey",
    "pending_filter",
    "reencrypt",
    "survey",
    "token_pattern",
]

#: Rounds over the rows a concurrent write took first before the run gives up on them.
RACE_ROUNDS = 5


@dataclasses.dataclass(slots=True)
class FieldReport:
    """One field's figures: rows re-encrypted (or that would be, in a dry run) and rows
    a concurrent write changed first that were still pending when the run ended."""

    name: str
    reencrypted: int = 0
    raced: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """A value that could not be decrypted: its key is not configured, or it was altered."""

    table: str
    pk: Any
    field: str
    key_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.table} pk={self.pk} {self.field}: key {self.key_id!r}, {self.reason}"


@dataclasses.dataclass(slots=True)
class ReencryptReport:
    current_key_id: str
    dry_run: bool
    fields: dict[str, FieldReport]
    failures: list[Failure] = dataclasses.field(default_factory=list)
    batches: int = 0

    @property
    def complete(self) -> bool:
        """Nothing left under another key (as far as this run could write)."""
        return not self.failures and not any(field.raced for field in self.fields.values())


def token_pattern(exclude: Sequence[str]) -> str:
    """A regular expression matching a ciphertext prefix whose key id is none of ``exclude``:
    the same syntax on PostgreSQL (ARE), MariaDB/MySQL (PCRE/ICU) and SQLite (Python's re)."""
    prefix = TOKEN_PREFIX.replace(".", r"\.")
    if not exclude:
        return prefix
    ids = "|".join(key_id.replace(".", r"\.") for key_id in exclude)
    return f"{prefix}(?!({ids}):)"


def _text_of(field: EncryptedField) -> str:
    return f"_jg_text_{field.field}"


def pending_filter(
    queryset: models.QuerySet[Any], fields: Iterable[EncryptedField], exclude: Sequence[str]
) -> models.QuerySet[Any]:
    """``queryset`` narrowed to the rows where one of ``fields`` (all of one model) holds a
    ciphertext under a key id not in ``exclude`` (as text: a clear value containing the prefix
    matches too, and is told apart when the row is read)."""
    pattern = token_pattern(exclude)
    condition = models.Q()
    for field in fields:
        queryset = queryset.annotate(**{_text_of(field): Cast(field.field, output_field=models.TextField())})
        condition |= models.Q(**{f"{_text_of(field)}__regex": pattern})
    return queryset.filter(condition)


def _by_model() -> dict[str, list[EncryptedField]]:
    grouped: dict[str, list[EncryptedField]] = defaultdict(list)
    for field in ENCRYPTED_FIELDS:
        grouped[field.model_name].append(field)
    return grouped


def reencrypt(
    alias: str,
    *,
    batch_size: int = 200,
    sleep: float = 0.0,
    dry_run: bool = False,
    on_batch: Callable[[str, int], None] | None = None,
) -> ReencryptReport:
    """Seal again, under the current key, every stored ciphertext under another key.

    ``sleep`` seconds pass between batches (to spare a busy database); ``on_batch(table, rows)``
    is told of each batch written. A value that cannot be decrypted is reported in
    ``failures`` and left as it is; the others go on.
    """
    ring = keyring()
    if not ring.enabled:
        raise DecryptionError("", "missing key", "JOBGUARD['ENCRYPTION']['KEYS']")
    current = ring.keys[0][0]
    report = ReencryptReport(
        current_key_id=current,
        dry_run=dry_run,
        fields={field.name: FieldReport(field.name) for field in ENCRYPTED_FIELDS},
    )
    for model_fields in _by_model().values():
        _reencrypt_model(alias, model_fields, current, batch_size, sleep, dry_run, report, on_batch)
    return report


def _reencrypt_model(
    alias: str,
    fields: list[EncryptedField],
    current: str,
    batch_size: int,
    sleep: float,
    dry_run: bool,
    report: ReencryptReport,
    on_batch: Callable[[str, int], None] | None,
) -> None:
    model = fields[0].model
    table = model._meta.db_table
    names = [field.field for field in fields]
    base = pending_filter(model._default_manager.using(alias), fields, [current])
    failed: set[tuple[Any, str]] = set()
    retry: set[Any] | None = None  # None: the first pass, over every row
    for _round in range(RACE_ROUNDS + 1):
        raced: set[Any] = set()
        cursor: Any = None
        while True:
            queryset = base if retry is None else base.filter(pk__in=sorted(retry))
            if cursor is not None:
                queryset = queryset.filter(pk__gt=cursor)
            # Each field also as the database's text of it: the compare-and-set compares that,
            # byte for byte (a JSON value re-encoded by Python may differ in its numbers'
            # spelling or its escapes on SQLite and MariaDB).
            texts = [_text_of(field) for field in fields]
            rows = list(queryset.order_by("pk").values_list("pk", *names, *texts)[:batch_size])
            if not rows:
                break
            cursor = rows[-1][0]
            writes: list[tuple[Any, EncryptedField, Any, Any]] = []
            for pk, *values in rows:
                for field, stored, text in zip(
                    fields, values[: len(fields)], values[len(fields) :], strict=True
                ):
                    if (pk, field.field) in failed or all(k == current for k in field.key_ids(stored)):
                        continue
                    try:
                        sealed = field.reencrypt(stored, keep=current.__eq__)
                    except DecryptionError as exc:
                        failed.add((pk, field.field))
                        report.failures.append(Failure(table, pk, field.field, exc.key_id, exc.reason))
                        continue
                    writes.append((pk, field, text, sealed))
            if dry_run:
                for _pk, field, _stored, _sealed in writes:
                    report.fields[field.name].reencrypted += 1
            elif writes:
                raced |= _write(alias, model, writes, report)
                report.batches += 1
                if on_batch is not None:
                    on_batch(table, len(writes))
                if sleep > 0:
                    time.sleep(sleep)
        if dry_run or not raced:
            break
        retry = raced
    else:
        for _pk, field_name in _still_pending(alias, model, fields, current, retry or set()):
            report.fields[f"{table}.{field_name}"].raced += 1


def _write(
    alias: str,
    model: type[models.Model],
    writes: list[tuple[Any, EncryptedField, Any, Any]],
    report: ReencryptReport,
) -> set[Any]:
    """One batch in one transaction; the primary keys whose compare-and-set found another value."""
    raced: set[Any] = set()
    manager = model._default_manager.using(alias)
    done: list[EncryptedField] = []
    try:
        with transaction.atomic(using=alias):
            for pk, field, text, sealed in writes:
                row = manager.annotate(
                    **{_text_of(field): Cast(field.field, output_field=models.TextField())}
                )
                if row.filter(pk=pk, **{_text_of(field): text}).update(**{field.field: sealed}):
                    done.append(field)
                else:
                    raced.add(pk)
    except DatabaseError:
        # A deadlock or lock timeout against a worker's statement: the whole batch rolled
        # back, and its rows are read again in the next round.
        if connections[alias].in_atomic_block:
            raise
        return {pk for pk, *_ in writes}
    for field in done:
        report.fields[field.name].reencrypted += 1
    return raced


def _still_pending(
    alias: str, model: type[models.Model], fields: list[EncryptedField], current: str, pks: set[Any]
) -> list[tuple[Any, str]]:
    rows = (
        model._default_manager.using(alias)
        .filter(pk__in=sorted(pks))
        .values_list("pk", *[field.field for field in fields])
    )
    return [
        (pk, field.field)
        for pk, *values in rows
        for field, stored in zip(fields, values, strict=True)
        if any(key_id != current for key_id in field.key_ids(stored))
    ]


@dataclasses.dataclass(slots=True)
class Survey:
    """What a bounded look at the stored rows found (see :func:`survey`)."""

    #: Rows looked at, over every table.
    rows: int = 0
    #: (``table.field``, retired key id) -> values under it among the rows looked at.
    retired: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    #: Unconfigured key id -> the first few ``table pk=… field`` that name it.
    unknown: dict[str, list[str]] = dataclasses.field(default_factory=dict)


#: Rows a survey reads at each end of each table (the oldest and the newest).
SURVEY_ROWS = 500
#: Rows with an unknown key id a survey reads per table, to name them.
_UNKNOWN_SAMPLE = 20


def survey(alias: str, rows: int = SURVEY_ROWS) -> Survey:
    """Look at the ``rows`` oldest and ``rows`` newest rows of each table with encrypted fields:
    which retired keys they still use and which key ids are not configured at all.

    Bounded whatever the tables' size (a system check runs it when workers start): two index
    lookups find the window's bounds, then one query counts and one samples. The oldest rows
    are where a forgotten re-encryption leaves values; the newest, where a process without
    the current key writes. ``jobguard_reencrypt --dry-run`` counts every row.
    """
    ring = keyring()
    configured = [key_id for key_id, _ in ring.keys]
    found = Survey()
    for fields in _by_model().values():
        model = fields[0].model
        table = model._meta.db_table
        manager = model._default_manager.using(alias)
        oldest = list(manager.order_by("pk").values_list("pk", flat=True)[rows - 1 : rows])
        newest = list(manager.order_by("-pk").values_list("pk", flat=True)[rows - 1 : rows])
        window = manager.all()
        if oldest and newest and oldest[0] < newest[0]:
            window = manager.filter(models.Q(pk__lte=oldest[0]) | models.Q(pk__gte=newest[0]))
        for field in fields:
            window = window.annotate(**{_text_of(field): Cast(field.field, output_field=models.TextField())})
        counts: dict[str, Any] = {"_rows": models.Count("pk")}
        for index, field in enumerate(fields):
            for number, key_id in enumerate(configured[1:]):
                counts[f"_f{index}_{number}"] = models.Count(
                    "pk", filter=models.Q(**{f"{_text_of(field)}__contains": f"{TOKEN_PREFIX}{key_id}:"})
                )
        totals = window.aggregate(**counts)
        found.rows += int(totals["_rows"] or 0)
        for index, field in enumerate(fields):
            for number, key_id in enumerate(configured[1:]):
                if totals[f"_f{index}_{number}"]:
                    found.retired[field.name, key_id] = int(totals[f"_f{index}_{number}"])
        condition = models.Q()
        for field in fields:
            condition |= models.Q(**{f"{_text_of(field)}__regex": token_pattern(configured)})
        sample = window.filter(condition).order_by("pk").values_list("pk", *[f.field for f in fields])
        for pk, *values in sample[:_UNKNOWN_SAMPLE]:
            for field, stored in zip(fields, values, strict=True):
                for key_id in field.key_ids(stored):
                    if key_id not in configured:
                        named = found.unknown.setdefault(key_id, [])
                        if len(named) < 3:
                            named.append(f"{table} pk={pk} {field.field}")
    return found
