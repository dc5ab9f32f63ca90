"""The dead-letter reason ``invalid_result`` reads "return value refused (not JSON, or too large)".

A result over ``MAX_RESULT_BYTES`` is refused under it too; only the label changes.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobguard", "0027_notify_settled_waited"),
    ]

    operations = [
        migrations.AlterField(
            model_name="deadletter",
            name="reason",
            field=models.CharField(
                choices=[
                    ("permanent_error", "permanent error"),
                    ("retries_exhausted", "retries exhausted"),
                    ("lease_expired", "lease expired on the last attempt"),
                    ("unknown_task", "task not registered"),
                    ("invalid_payload", "payload does not fit the task"),
                    ("invalid_result", "return value refused (not JSON, or too large)"),
                    ("hard_timeout", "ran past its hard timeout"),
                ],
                max_length=32,
            ),
        ),
    ]
