"""A job knows whether another job may wait for it, so an ack of jobs nobody waits for skips the lookup.

The column defaults to True: every existing row, and any row written without it (the ORM, or
a process of an older release during a rolling upgrade, which also stores dependencies
without marking their parents), is looked up as before. The store inserts new jobs with
False, and storing a dependency sets its parent's.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobguard", "0019_mysql_exact_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="has_dependants",
            field=models.BooleanField(
                db_default=True,
                editable=False,
                help_text=(
                    "Another job may wait for this one to succeed (a chain's next step, or after=); "
                    "its ack then looks its dependants up."
                ),
            ),
        ),
    ]
