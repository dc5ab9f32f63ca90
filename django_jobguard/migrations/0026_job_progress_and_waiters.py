"""A job's reported progress, and whether somebody waits on its outcome (both added empty)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobguard", "0025_notify_modes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="progress",
            field=models.JSONField(
                blank=True,
                editable=False,
                help_text="Last progress the handler reported; NULL if none.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="waited",
            field=models.BooleanField(
                db_default=False,
                default=False,
                editable=False,
                help_text="Somebody waits on the outcome: settling it sends a wake-up.",
            ),
        ),
    ]
