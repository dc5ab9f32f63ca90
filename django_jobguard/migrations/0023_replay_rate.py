"""The redrive rate changed from the console, and the console's idempotency-key prefix lookup.

An append-only table: each row is one change, who made it and why; the newest is the rate
every worker's redrive pass applies (NULL, or no row: ``JOBGUARD["REPLAY"]["RATE_PER_MINUTE"]``).

On PostgreSQL, a ``varchar_pattern_ops`` index of the dead letters' idempotency keys, so that
the admin's prefix search (``order-500*``, a ``LIKE 'order-500%'``) reads an index under any
database collation; the existing ``jobguard_dl_idem_idx`` serves it only under "C". SQLite
and MariaDB/MySQL (binary key collation since 0022) compare keys by code point, and the
search reads ``jobguard_dl_idem_idx`` as a range there: nothing to add.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models

LIKE_INDEX = "jobguard_dl_idem_like_idx"


def add_like_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX {LIKE_INDEX} ON jobguard_deadletter (idempotency_key varchar_pattern_ops) "
            "WHERE idempotency_key IS NOT NULL"
        )


def drop_like_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {LIKE_INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("jobguard", "0022_mysql_no_pad_keys"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ReplayRateChange",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "rate_per_minute",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Redrives a minute across all workers; empty: the setting.",
                        null=True,
                    ),
                ),
                (
                    "actor_name",
                    models.CharField(
                        blank=True, default="", help_text="Kept if the user goes.", max_length=150
                    ),
                ),
                ("reason", models.TextField(blank=True, default="")),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(), editable=False
                    ),
                ),
                (
                    "actor",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name": "redrive rate change",
                "verbose_name_plural": "redrive rate changes",
                "ordering": ["-id"],
            },
        ),
        # Not in the model's state: a PostgreSQL-only operator class (elsewhere, nothing).
        migrations.RunPython(add_like_index, drop_like_index, elidable=False),
    ]
