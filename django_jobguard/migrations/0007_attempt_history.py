# The per-attempt history of a job (worker, start, end, error), written by the claim and
# failure statements; Django's Tasks API reads it for TaskResult.worker_ids and .errors.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobguard", "0006_schedules"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="attempt_history",
            field=models.JSONField(
                blank=True,
                db_default=[],
                default=list,
                editable=False,
                help_text=(
                    "One entry per attempt: worker_id, started_at, and for a failed one finished_at, "
                    "error_class, error and traceback."
                ),
            ),
        ),
    ]
