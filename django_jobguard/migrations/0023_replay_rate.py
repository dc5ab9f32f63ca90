"""The redrive rate changed from the console (docs/how-to/operate-the-admin.md).

An append-only table: each row is one change, who made it and why; the newest is the rate
every worker's redrive pass applies (NULL, or no row: ``JOBGUARD["REPLAY"]["RATE_PER_MINUTE"]``).
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


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
    ]
