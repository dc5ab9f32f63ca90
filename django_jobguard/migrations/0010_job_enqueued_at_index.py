# The job list's "enqueued" filter (it replaced the date hierarchy, whose year and day lists
# scanned the whole table) reads its range and its count off this index.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobguard", "0009_console"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["enqueued_at"], name="jobguard_job_enqueued_idx"),
        ),
    ]
